package zapslog

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestZapEntriesReachTheSlogHandlerWithTheirFields(t *testing.T) {
	var buf bytes.Buffer
	l := New(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	l = l.Named("node").With(zap.String("node", "n1"))
	l.Debug("not written: below the handler's level")
	l.Warn("lease lost", zap.Int("bucket", 7), zap.Int64("epoch", 3), zap.Bool("held", false),
		zap.Duration("after", 1500*time.Millisecond), zap.Float64("share", 0.5), zap.Error(errors.New("taken")),
		zap.Strings("kinds", []string{"a", "b"}))

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want the warning alone:\n%s", len(lines), buf.String())
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"level": "WARN", "msg": "lease lost", "logger": "node", "node": "n1", "bucket": 7.0, "epoch": 3.0,
		"held": false, "after": 1.5e9, "share": 0.5, "error": "taken",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v (%T), want %v", k, got[k], got[k], v)
		}
	}
	if kinds, _ := got["kinds"].([]any); len(kinds) != 2 {
		t.Errorf("kinds = %v, want the two of them", got["kinds"])
	}
}

func TestLevelsMapOntoSlogsScale(t *testing.T) {
	for zl, sl := range map[zapcore.Level]slog.Level{
		zapcore.DebugLevel: slog.LevelDebug, zapcore.InfoLevel: slog.LevelInfo,
		zapcore.WarnLevel: slog.LevelWarn, zapcore.ErrorLevel: slog.LevelError,
	} {
		if got := Level(zl); got != sl {
			t.Errorf("Level(%v) = %v, want %v", zl, got, sl)
		}
	}
	if Level(zapcore.DPanicLevel) <= slog.LevelError {
		t.Errorf("DPanic maps to %v, not above error", Level(zapcore.DPanicLevel))
	}
}
