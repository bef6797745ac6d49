package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newReplayCommand is `appview jetstream-replay`; the server itself is in
// package jetstream.
func newReplayCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "jetstream-replay --file F.jsonl [--listen ADDR] [--rate N]",
		Short: "Serve a JSONL capture as a local Jetstream v1 endpoint",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("jetstream-replay: not built yet")
		},
	}
}
