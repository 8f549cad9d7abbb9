#!/usr/bin/env bash
# Opt-in browser tests: every notebook run in a real JupyterLab (loopback, random token) by
# Playwright driving the distribution's Chromium. Not part of .ci/run: it needs Debian's chromium
# package (apt) and about 10 minutes on 2 cores. Screenshots go to $CUSCIKIT_BROWSER_ARTIFACTS
# (default: browser-artifacts/, kept whether the tests pass or fail).
#
#   bash tools/browser_tests.sh            # all notebooks
#   bash tools/browser_tests.sh -k 01_     # one of them
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x "${CUSCIKIT_CHROMIUM:-/usr/bin/chromium}" ]; then
  apt-get update
  apt-get install -y --no-install-recommends chromium  # the browser, not Playwright's download
fi
python3 -m pip install torch==2.13.0 -e ".[test,jupyter]" "playwright>=1.40"
export CUSCIKIT_BROWSER_TESTS=1
export CUSCIKIT_BROWSER_ARTIFACTS="${CUSCIKIT_BROWSER_ARTIFACTS:-$PWD/browser-artifacts}"
python3 -m pytest -m browser tests/browser -p no:cacheprovider "$@"
