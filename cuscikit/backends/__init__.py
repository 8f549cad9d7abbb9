"""Device dispatch: the compiled CPU module now, CUDA modules later."""
