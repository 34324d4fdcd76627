#!/usr/bin/env bash
# Build the verifier image with no network access during `docker build`, from a Lean project
# already built on this machine (see Dockerfile.local).
#
#   runtimes/docker/build-local.sh PROJECT_DIR [TAG]
#
#   PROJECT_DIR  a Lean project with Mathlib's .olean files and the REPL built in its .lake
#                (what `leanrl setup` makes: the REPL is a dependency, .lake/packages/REPL)
#   TAG          image tag (default leanrl-verifier:local)
#
# Environment: ELAN_HOME (default ~/.elan) holds the toolchain; WHEELS, a folder of wheels for
# requirements-service.txt (default: built now with `pip wheel`, which may use the network or
# pip's cache -- this happens before the build, not during it); PYTHON_IMAGE, a local base image.
set -euo pipefail

PROJECT="$(cd "${1:?usage: build-local.sh PROJECT_DIR [TAG]}" && pwd)"
TAG="${2:-leanrl-verifier:local}"
ELAN="${ELAN_HOME:-$HOME/.elan}"
HERE="$(cd "$(dirname "$0")" && pwd)"
SRC="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-python3}"

test -f "$PROJECT/lean-toolchain" || { echo "no lean-toolchain in $PROJECT" >&2; exit 2; }
test -x "$PROJECT/.lake/packages/REPL/.lake/build/bin/repl" || test -x "$PROJECT/.lake/build/bin/repl" \
  || { echo "REPL not built in $PROJECT: run 'leanrl setup' or 'lake build repl' there" >&2; exit 2; }
test -d "$ELAN/toolchains" || { echo "no elan toolchains in $ELAN (set ELAN_HOME)" >&2; exit 2; }

CTX="$(mktemp -d)"
trap 'rm -rf "$CTX"' EXIT
cp "$HERE/Dockerfile.local" "$HERE/requirements-service.txt" "$CTX/"
# Only the toolchain the project uses, to keep the image small.
TOOLCHAIN="$(tr -d '[:space:]' < "$PROJECT/lean-toolchain")"
TCDIR="$(echo "$TOOLCHAIN" | sed 's|/|--|; s|:|---|')"
mkdir -p "$CTX/elan/toolchains"
cp -a "$ELAN/bin" "$CTX/elan/"
cp -a "$ELAN/toolchains/$TCDIR" "$CTX/elan/toolchains/" 2>/dev/null \
  || cp -a "$ELAN/toolchains/." "$CTX/elan/toolchains/"
[ -f "$ELAN/settings.toml" ] && cp "$ELAN/settings.toml" "$CTX/elan/"
cp -a "$PROJECT" "$CTX/project"
mkdir -p "$CTX/wheels"
if [ -n "${WHEELS:-}" ]; then
  cp "$WHEELS"/*.whl "$CTX/wheels/"
else
  "$PY" -m pip wheel -q -w "$CTX/wheels" -r "$HERE/requirements-service.txt"
fi
"$PY" -m pip wheel -q --no-deps -w "$CTX/wheels" "$SRC"
# Readable by the image's unprivileged user as copied (a chmod inside the image would duplicate
# the whole project into another layer).
chmod -R a+rX "$CTX"

docker build --network none ${PYTHON_IMAGE:+--build-arg PYTHON_IMAGE="$PYTHON_IMAGE"} \
  -f "$CTX/Dockerfile.local" -t "$TAG" "$CTX"
echo "built $TAG"
