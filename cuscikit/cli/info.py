"""`cuscikit info`: versions, build flags, OpenMP threads, GPUs."""

from __future__ import annotations

from cuscikit.cli.common import add_json, emit


def register(sub) -> None:
    s = sub.add_parser(
        "info",
        help="versions, build flags, threads and GPUs",
        description="Versions, build flags, OpenMP threads and GPUs.",
    )
    add_json(s)
    s.set_defaults(func=run)


def run(args) -> int:
    import platform

    import numpy
    import scipy

    import cuscikit
    from cuscikit.backends import core, cuda_build

    info: dict = {
        "cuscikit": cuscikit.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
    }
    for mod in ("torch", "cupy", "pyscf", "mpi4py"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - optional, any import failure means "absent"
            info[mod] = None
    build = dict(core().build_info())
    info["extension"] = build
    gpus = []
    if info["torch"]:
        import torch

        if torch.cuda.is_available():
            for d in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(d)
                gpus.append(f"{p.name} ({p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor})")
    info["gpus"] = gpus
    arch = cuda_build()  # built only where nvcc and a driver were present at install time
    info["cuda_kernels"] = f"built for sm_{arch}" if arch else None
    lines = [f"cuscikit {info['cuscikit']}  (python {info['python']}, {info['platform']})"]
    for mod in ("numpy", "scipy", "torch", "cupy", "pyscf", "mpi4py"):
        lines.append(f"  {mod:8s} {info[mod] or 'not installed'}")
    lines.append(f"  extension: {build['flags']}")
    lines.append(
        f"  OpenMP: {build['openmp']}, threads: {build['max_threads']}, "
        f"max words: {build['max_words']} ({64 * build['max_words']} spin orbitals)"
    )
    lines.append("  GPUs: " + (", ".join(gpus) if gpus else "none"))
    lines.append("  CUDA kernels: " + (info["cuda_kernels"] or "not built (see README: On a GPU)"))
    emit(args, info, lines)
    return 0
