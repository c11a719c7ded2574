#!/usr/bin/env bash
# tools/npm-cached.sh DIR NPM-ARGS...: give DIR the node_modules its package.json and
# package-lock.json pin, unpacked once per machine. `npm NPM-ARGS...` installs them into a
# directory of the machine's cache (~/.cache/rsim/npm/, or $XDG_CACHE_HOME) named by a hash of
# the two files, the Node version and the platform, and DIR/node_modules becomes a link to it: a
# clean clone on a machine that installed the same lockfile before links instead of unpacking
# again (code-server alone is tens of thousands of files, two minutes on two cores). A cached
# directory is used only once its install finished (a marker written last); one install runs at
# a time (a lock beside them); the three installs of a folder used last are kept, older ones go.
# RSIM_NPM_CACHE=off installs into DIR itself.
set -euo pipefail
dir=$1
shift
in_place() {
  if [ -L "$dir/node_modules" ]; then rm "$dir/node_modules"; fi
  (cd "$dir" && npm "$@") >&2
  exit 0
}
[ "${RSIM_NPM_CACHE:-}" = off ] && in_place "$@"
key=$({ cat "$dir/package.json" "$dir/package-lock.json"; node --version; uname -sm; } | sha256sum | cut -c1-24)
if [ -n "${XDG_CACHE_HOME:-}" ]; then
  root=$XDG_CACHE_HOME/rsim/npm
elif [ -n "${HOME:-}" ]; then
  root=$HOME/.cache/rsim/npm
else
  echo "npm-cached: no HOME nor XDG_CACHE_HOME; installing in $dir" >&2
  in_place "$@"
fi
name=$(basename "$(cd "$dir" && pwd)")
cache="$root/$name-$key"
KEEP=3
# No writable cache (a read-only home): install in place, as without the cache.
mkdir -p "$root" 2>/dev/null && [ -w "$root" ] || { echo "npm-cached: no writable $root; installing in $dir" >&2; in_place "$@"; }
(
  # One install at a time (flock is util-linux; without it, installs are not serialised).
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  if [ ! -e "$cache/.rsim-complete" ]; then
    echo "npm-cached: installing $dir's packages into $cache" >&2
    rm -rf "$cache"
    mkdir -p "$cache"
    cp "$dir/package.json" "$dir/package-lock.json" "$cache/"
    (cd "$cache" && npm "$@") >&2
  fi
  # Used now (the marker's time says when last), and at most KEEP installs per folder are kept:
  # clones with ever new lockfiles cannot grow the cache without end. A link left to an install
  # removed here is remade by the next run.
  touch "$cache/.rsim-complete"
  ls -1dt "$root/$name"-*/.rsim-complete 2>/dev/null | tail -n +$((KEEP + 1)) | while read -r old; do
    rm -rf "$(dirname "$old")"
  done
) 9>"$root/.lock"
# What was there (an install in place, or a link to another lockfile's packages) gives way.
if [ -L "$dir/node_modules" ]; then
  [ "$(readlink "$dir/node_modules")" = "$cache/node_modules" ] && exit 0
  rm "$dir/node_modules"
elif [ -e "$dir/node_modules" ]; then
  rm -rf "$dir/node_modules"
fi
ln -s "$cache/node_modules" "$dir/node_modules"
