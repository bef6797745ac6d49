//go:build race

package main

// raceEnabled makes TestMain build the child binary with -race too.
const raceEnabled = true
