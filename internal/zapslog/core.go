// Package zapslog writes zap's log entries to a log/slog handler, so that a
// node, which logs through zap, logs where an application that uses slog
// logs, without the application building a zap logger.
package zapslog

import (
	"context"
	"log/slog"
	"math"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a zap logger whose entries go to l's handler, at the slog
// level that matches theirs.
func New(l *slog.Logger) *zap.Logger {
	return zap.New(&core{h: l.Handler()})
}

// core is a zapcore.Core over a slog.Handler. The fields given to With are
// handed to the handler's WithAttrs once, as slog does.
type core struct {
	h slog.Handler
}

var _ zapcore.Core = (*core)(nil)

// Level maps a zap level onto slog's scale, on which each of zap's steps
// is four of slog's: debug -4, info 0, warn 4, error 8, and above.
func Level(l zapcore.Level) slog.Level { return slog.Level(int(l) * 4) }

func (c *core) Enabled(l zapcore.Level) bool {
	return c.h.Enabled(context.Background(), Level(l))
}

func (c *core) With(fields []zapcore.Field) zapcore.Core {
	if len(fields) == 0 {
		return c
	}
	return &core{h: c.h.WithAttrs(attrs(fields))}
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	var pc uintptr // none, unless zap was asked to record the caller
	if e.Caller.Defined {
		pc = e.Caller.PC
	}
	r := slog.NewRecord(e.Time, Level(e.Level), e.Message, pc)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(attrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (c *core) Sync() error { return nil }

// attrs turns zap fields into slog attributes, in order. A field is encoded
// the way zap encodes it (an error as its message, a duration as
// nanoseconds), and becomes one attribute per key it writes.
func attrs(fields []zapcore.Field) []slog.Attr {
	out := make([]slog.Attr, 0, len(fields))
	for _, f := range fields {
		switch f.Type {
		case zapcore.StringType:
			out = append(out, slog.String(f.Key, f.String))
			continue
		case zapcore.Int64Type, zapcore.Int32Type, zapcore.Int16Type, zapcore.Int8Type:
			out = append(out, slog.Int64(f.Key, f.Integer))
			continue
		case zapcore.BoolType:
			out = append(out, slog.Bool(f.Key, f.Integer == 1))
			continue
		case zapcore.DurationType:
			out = append(out, slog.Duration(f.Key, time.Duration(f.Integer)))
			continue
		case zapcore.Float64Type:
			out = append(out, slog.Float64(f.Key, math.Float64frombits(uint64(f.Integer))))
			continue
		case zapcore.SkipType:
			continue
		}
		enc := zapcore.NewMapObjectEncoder()
		f.AddTo(enc)
		for k, v := range enc.Fields {
			out = append(out, slog.Any(k, v))
		}
	}
	return out
}
