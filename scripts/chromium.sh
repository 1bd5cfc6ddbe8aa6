#!/usr/bin/env bash
# The browser for the book's test (tests/book/test_site.py): prints the path of a Chromium, installing Debian's
# package where none is found and this machine can (root with apt-get). Exits 1, saying why, where it cannot.
set -uo pipefail
find_browser() {
  for b in chromium chromium-browser google-chrome; do
    if command -v "$b" >/dev/null 2>&1; then command -v "$b"; return 0; fi
  done
  return 1
}
find_browser && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo ">> installing Chromium (apt-get install chromium) for the book's browser test" >&2
  if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); then
    echo "!! apt-get could not install chromium (no package registry reachable?)" >&2
    exit 1
  fi
  find_browser && exit 0
  echo "!! apt-get installed chromium, but no chromium command is on PATH" >&2
  exit 1
fi
echo "!! no Chromium found, and it cannot be installed here (needs root and apt-get):" \
     "install it with your package manager (apt-get install chromium, brew install chromium)" >&2
exit 1
