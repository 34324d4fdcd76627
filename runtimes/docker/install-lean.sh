#!/usr/bin/env bash
# Install the Lean toolchain (elan), a Lean project with Mathlib at a given revision, and the
# Lean REPL, under $LEAN_HOME (default /opt/lean). Used by runtimes/docker/Dockerfile and by the
# Modal image defined in runtimes/modal/image.py, so both contain the same thing.
#
#   install-lean.sh TOOLCHAIN MATHLIB_REV REPL_REV
#   install-lean.sh leanprover/lean4:v4.15.0 v4.15.0 v4.15.0
#
# MATHLIB_REV "none" makes a project without Mathlib (core Lean tasksets only).
set -euo pipefail

TOOLCHAIN="${1:?usage: install-lean.sh TOOLCHAIN MATHLIB_REV REPL_REV}"
MATHLIB_REV="${2:?missing MATHLIB_REV}"
REPL_REV="${3:?missing REPL_REV}"
LEAN_HOME="${LEAN_HOME:-/opt/lean}"
export ELAN_HOME="${ELAN_HOME:-/opt/elan}"
export PATH="$ELAN_HOME/bin:$PATH"

mkdir -p "$LEAN_HOME"
if ! command -v elan >/dev/null; then
  curl -sSfL https://raw.githubusercontent.com/leanprover/elan/master/elan-init.sh -o /tmp/elan-init.sh
  sh /tmp/elan-init.sh -y --no-modify-path --default-toolchain "$TOOLCHAIN"
  rm -f /tmp/elan-init.sh
fi
elan toolchain install "$TOOLCHAIN"
elan default "$TOOLCHAIN"

# The project the checks run in: Mathlib's prebuilt .olean files come from its cache.
PROJECT="$LEAN_HOME/project"
mkdir -p "$PROJECT"
cd "$PROJECT"
echo "$TOOLCHAIN" > lean-toolchain
if [ "$MATHLIB_REV" = "none" ]; then
  printf 'name = "leanrl_verifier"\n' > lakefile.toml
else
  cat > lakefile.toml <<TOML
name = "leanrl_verifier"

[[require]]
name = "mathlib"
git = "https://github.com/leanprover-community/mathlib4"
rev = "$MATHLIB_REV"
TOML
  lake update
  lake exe cache get
fi
lake build

# The REPL, built with the same toolchain.
if [ ! -d "$LEAN_HOME/repl" ]; then
  git clone --quiet https://github.com/leanprover-community/repl "$LEAN_HOME/repl"
fi
cd "$LEAN_HOME/repl"
git fetch --quiet --tags origin
git checkout --quiet "$REPL_REV"
echo "$TOOLCHAIN" > lean-toolchain
lake build repl
test -x "$LEAN_HOME/repl/.lake/build/bin/repl"
echo "installed $TOOLCHAIN, mathlib $MATHLIB_REV, repl $REPL_REV under $LEAN_HOME"
