#!/usr/bin/env bash
# tools/npm-cached.sh DIR NPM-ARGS...: give DIR the node_modules its package.json and
# package-lock.json pin, unpacked once per machine. `npm NPM-ARGS...` installs them into a
# directory of the machine's cache (~/.cache/rsim/npm/, or $XDG_CACHE_HOME) named by a hash of
# the two files, the Node version and the platform, and DIR/node_modules becomes a link to it: a
# clean clone on a machine that installed the same lockfile before links instead of unpacking
# again (code-server alone is tens of thousands of files, two minutes on two cores). A cached
# directory is used only once its install finished (a marker written last); one install runs at
# a time (a lock beside them). RSIM_NPM_CACHE=off installs into DIR itself.
set -euo pipefail
dir=$1
shift
if [ "${RSIM_NPM_CACHE:-}" = off ]; then
  [ -L "$dir/node_modules" ] && rm "$dir/node_modules"
  (cd "$dir" && npm "$@") >&2
  exit 0
fi
key=$({ cat "$dir/package.json" "$dir/package-lock.json"; node --version; uname -sm; } | sha256sum | cut -c1-24)
root="${XDG_CACHE_HOME:-$HOME/.cache}/rsim/npm"
cache="$root/$(basename "$(cd "$dir" && pwd)")-$key"
mkdir -p "$root"
(
  flock 9
  if [ ! -e "$cache/.rsim-complete" ]; then
    echo "npm-cached: installing $dir's packages into $cache" >&2
    rm -rf "$cache"
    mkdir -p "$cache"
    cp "$dir/package.json" "$dir/package-lock.json" "$cache/"
    (cd "$cache" && npm "$@") >&2
    touch "$cache/.rsim-complete"
  fi
) 9>"$root/.lock"
# What was there (an install in place, or a link to another lockfile's packages) gives way.
if [ -L "$dir/node_modules" ]; then
  [ "$(readlink "$dir/node_modules")" = "$cache/node_modules" ] && exit 0
  rm "$dir/node_modules"
elif [ -e "$dir/node_modules" ]; then
  rm -rf "$dir/node_modules"
fi
ln -s "$cache/node_modules" "$dir/node_modules"
