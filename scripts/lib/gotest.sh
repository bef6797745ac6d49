# Sourced by scripts/test and scripts/soak: the environment of a test run.

# A race-enabled test binary sleeps 1 s at exit (GORACE atexit_sleep_ms
# defaults to 1000): a second per package, for races that would start
# after the last test; a race during a test fails it all the same.
export GORACE="${GORACE:+$GORACE }atexit_sleep_ms=0"

# Every test binary is linked anew by gcc (go-libsql is cgo), about 3.5 s
# of CPU each with the default linker for some 35 binaries a run. mold
# (Debian package mold; .ci/run installs it) takes 40% less, gold 25%;
# without either, or with a gcc that cannot use them, the default stays.
# GOFLAGS (added to the value in force, from the environment or go env)
# carries it to the builds the tests run themselves.
for ld in mold gold; do
  if command -v "ld.$ld" >/dev/null && command -v gcc >/dev/null &&
     echo 'int main(void){return 0;}' | gcc -fuse-ld="$ld" -x c - -o /dev/null 2>/dev/null; then
    GOFLAGS="$(go env GOFLAGS)"
    export GOFLAGS="${GOFLAGS:+$GOFLAGS }-ldflags=-extldflags=-fuse-ld=$ld"
    break
  fi
done
