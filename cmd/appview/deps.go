package main

import (
	_ "github.com/asynkron/protoactor-go/actor"
	_ "github.com/cenkalti/backoff/v5"
	_ "github.com/fxamacker/cbor/v2"
	_ "github.com/gorilla/websocket"
	_ "github.com/klauspost/compress/zstd"
	_ "github.com/libsql/sqlite-antlr4-parser/sqliteparserutils"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/rs/zerolog"
	_ "github.com/spf13/cobra"
	_ "github.com/tursodatabase/go-libsql"
	_ "go.uber.org/goleak"
	_ "go.yaml.in/yaml/v3"
)

func main() {}
