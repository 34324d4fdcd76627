#!/usr/bin/env bash
# Install the Lean toolchain (elan) and a Lean project with Mathlib at a given revision and the
# Lean REPL as a dependency, under $LEAN_HOME/project (default /opt/lean/project). The layout is
# the one `leanrl setup` makes, so the local runtime finds the REPL in it
# (.lake/packages/REPL/.lake/build/bin/repl). Used by runtimes/docker/Dockerfile and by the Modal
# image defined in runtimes/modal/image.py, so both contain the same thing.
#
#   install-lean.sh TOOLCHAIN MATHLIB_REV REPL_REV
#   install-lean.sh leanprover/lean4:v4.24.0 v4.24.0 v4.24.0
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

PROJECT="$LEAN_HOME/project"
mkdir -p "$PROJECT"
cd "$PROJECT"
echo "$TOOLCHAIN" > lean-toolchain
{
  echo 'import Lake'
  echo 'open Lake DSL'
  echo
  echo 'package leanrl_project'
  echo
  if [ "$MATHLIB_REV" != "none" ]; then
    echo "require mathlib from git \"https://github.com/leanprover-community/mathlib4\" @ \"$MATHLIB_REV\""
  fi
  echo "require REPL from git \"https://github.com/leanprover-community/repl\" @ \"$REPL_REV\""
} > lakefile.lean
lake update
# Mathlib's prebuilt .olean files only fit the toolchain Mathlib was built with (and Mathlib's
# update hook may rewrite our lean-toolchain to it): refuse a mismatch instead of silently
# building an image whose Lean differs from the taskset's, or compiling Mathlib for hours.
if [ "$MATHLIB_REV" != "none" ]; then
  MATHLIB_TC="$(tr -d '[:space:]' < .lake/packages/mathlib/lean-toolchain)"
  if [ "$MATHLIB_TC" != "$TOOLCHAIN" ]; then
    echo "install-lean.sh: mathlib $MATHLIB_REV is built for $MATHLIB_TC, not $TOOLCHAIN:" \
      "pass the toolchain and Mathlib revision the taskset was written for (they must match)" >&2
    exit 3
  fi
  echo "$TOOLCHAIN" > lean-toolchain
  lake exe cache get   # Mathlib's prebuilt .olean files
fi
REPL_TC="$(tr -d '[:space:]' < .lake/packages/REPL/lean-toolchain 2>/dev/null || true)"
if [ -n "$REPL_TC" ] && [ "$REPL_TC" != "$TOOLCHAIN" ]; then
  echo "install-lean.sh: warning: repl $REPL_REV is pinned to $REPL_TC, building it with" \
    "$TOOLCHAIN (use the REPL tag named after the toolchain if the build fails)" >&2
fi
lake build repl
test -x "$PROJECT/.lake/packages/REPL/.lake/build/bin/repl"
echo "installed $TOOLCHAIN, mathlib $MATHLIB_REV, repl $REPL_REV in $PROJECT"
