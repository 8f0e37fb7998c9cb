package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

var (
	logLevelFlag  = &cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"}
	logFormatFlag = &cli.StringFlag{Name: "log-format", Value: "console", Usage: "console or json"}
)

// commonFlags go on every command that talks to the database.
func commonFlags(extra ...cli.Flag) []cli.Flag {
	return append([]cli.Flag{dsnFlag, dsnFileFlag, logLevelFlag, logFormatFlag}, extra...)
}

// newLogger builds the zap logger the flags ask for, writing to stderr so
// that stdout carries only command output.
func newLogger(c *cli.Context, stderr io.Writer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(c.String(logLevelFlag.Name))
	if err != nil {
		return nil, invalid(fmt.Errorf("invalid --log-level %q: use debug, info, warn or error", c.String(logLevelFlag.Name)))
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	encCfg.EncodeDuration = zapcore.StringDurationEncoder
	var enc zapcore.Encoder
	switch format := c.String(logFormatFlag.Name); format {
	case "json":
		enc = zapcore.NewJSONEncoder(encCfg)
	case "console":
		encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(encCfg)
	default:
		return nil, invalid(fmt.Errorf("invalid --log-format %q: use console or json", format))
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(stderr), level)), nil
}
