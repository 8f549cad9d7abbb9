#!/usr/bin/env bash
# Browser tests: every notebook run in a real JupyterLab (loopback, random token) by Playwright
# driving the distribution's Chromium (Debian's `chromium` package, not Playwright's download).
# .ci/run calls this after the test suite; run it alone after `pip install -e ".[test]"`.
# Installs what is missing: Debian's chromium (apt-get, as root, retried), the [jupyter] extra's
# packages and playwright (pip). Screenshots, the notebooks' output texts and JupyterLab's log of
# a failing notebook go to $CUSCIKIT_BROWSER_ARTIFACTS (default: .ci/artifacts/browser/;
# CUSCIKIT_BROWSER_KEEP=all keeps the screenshots of passing notebooks too).
#
#   bash tools/browser_tests.sh            # all notebooks
#   bash tools/browser_tests.sh -k 01_     # one of them
#
# Limits: CUSCIKIT_BROWSER_TIMEOUT seconds per notebook (default 600), CUSCIKIT_BROWSER_LIMIT
# seconds for the whole step (default 1500).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
CHROMIUM="${CUSCIKIT_CHROMIUM:-/usr/bin/chromium}"

retry() {  # retry N WHAT CMD...: run CMD up to N times, 15 s apart
  local n=$1 what=$2 k
  shift 2
  for ((k = 1; k <= n; k++)); do
    "$@" && return 0
    echo "browser tests: $what failed (try $k of $n)" >&2
    ((k < n)) && sleep 15
  done
  return 1
}

if [ ! -x "$CHROMIUM" ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
    echo "browser tests: no $CHROMIUM; install Debian's chromium (apt-get install chromium, as" \
      "root) or point CUSCIKIT_CHROMIUM at a Chromium binary" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  retry 3 "apt-get update" apt-get update -q \
    || { echo "browser tests: apt-get update failed 3 times (Debian's mirrors unreachable?)" >&2; exit 1; }
  retry 3 "apt-get install chromium" \
    apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 chromium \
    || { echo "browser tests: could not install Debian's chromium package" >&2; exit 1; }
fi
"$CHROMIUM" --version

# the [jupyter] extra's packages as pyproject.toml lists them, and Playwright (its Python
# package only: it drives the Chromium above and downloads no browser)
mapfile -t JUPYTER < <(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["jupyter"]))')
retry 3 "pip install" python3 -m pip install -q "${JUPYTER[@]}" "playwright>=1.40" \
  || { echo "browser tests: pip could not install ${JUPYTER[*]} playwright" >&2; exit 1; }
python3 -c "import cuscikit" 2> /dev/null \
  || { echo "browser tests: cuscikit is not installed; first pip install -e \".[test]\"" >&2; exit 1; }
# JupyterLab renders widgets through the jupyterlab_widgets extension, which it looks for under
# this interpreter's prefix; a virtual environment that sees ipywidgets in the system's
# site-packages lacks it there (widgets then show as text): install it where Lab looks.
if ! python3 -m jupyter labextension list 2>&1 | grep -q "@jupyter-widgets/jupyterlab-manager"; then
  python3 -m pip install -q --force-reinstall --no-deps jupyterlab_widgets
  python3 -m jupyter labextension list 2>&1 | grep -q "@jupyter-widgets/jupyterlab-manager" \
    || { echo "browser tests: JupyterLab does not find the widget manager extension" >&2; exit 1; }
fi
echo "browser tests: set up in $((SECONDS - t0)) s"

export CUSCIKIT_BROWSER_TESTS=1 CUSCIKIT_CHROMIUM="$CHROMIUM"
export CUSCIKIT_BROWSER_ARTIFACTS="${CUSCIKIT_BROWSER_ARTIFACTS:-$PWD/.ci/artifacts/browser}"
limit="${CUSCIKIT_BROWSER_LIMIT:-1500}"
t1=$SECONDS
rc=0
timeout --kill-after=30 "$limit" \
  python3 -m pytest -m browser tests/browser -p no:cacheprovider -v -s "$@" || rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "browser tests: stopped after the step's limit of $limit s (CUSCIKIT_BROWSER_LIMIT)" >&2
fi
echo "browser tests: $((SECONDS - t1)) s in the browser, $((SECONDS - t0)) s in all (exit $rc)"
if [ "$rc" != 0 ] && [ -d "$CUSCIKIT_BROWSER_ARTIFACTS" ]; then
  echo "browser tests: screenshots and logs of the failure in $CUSCIKIT_BROWSER_ARTIFACTS:" >&2
  ls -1 "$CUSCIKIT_BROWSER_ARTIFACTS" >&2
fi
exit "$rc"
