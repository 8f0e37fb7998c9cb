package patience

import (
	"testing"
	"time"
)

func TestLoadFactor(t *testing.T) {
	tests := []struct {
		load float64
		cpus int
		want float64
	}{
		{0, 2, 1},
		{1.5, 2, 1},
		{2, 2, 1},
		{6, 2, 3},
		{9, 2, 4.5},
		{100, 2, MaxLoadFactor},
		{4, 0, 4},
	}
	for _, tt := range tests {
		if got := loadFactor(tt.load, tt.cpus); got != tt.want {
			t.Errorf("loadFactor(%v, %d) = %v, want %v", tt.load, tt.cpus, got, tt.want)
		}
	}
}

func TestTheEnvironmentFixesTheFactor(t *testing.T) {
	t.Setenv(EnvFactor, "2.5")
	if got := Scale(10 * time.Second); got != 25*time.Second {
		t.Errorf("Scale(10s) with %s=2.5 = %v, want 25s", EnvFactor, got)
	}
}

func TestABadFactorIsRefused(t *testing.T) {
	for _, v := range []string{"0.5", "x", "-3", "NaN", "Inf"} {
		if _, err := parseFactor(v); err == nil {
			t.Errorf("parseFactor(%q) accepted it", v)
		}
	}
	t.Setenv(EnvFactor, "fast")
	defer func() {
		if recover() == nil {
			t.Errorf("Factor with %s=fast did not panic", EnvFactor)
		}
	}()
	Factor()
}

func TestScaleNeverShortens(t *testing.T) {
	if got := Scale(time.Second); got < time.Second {
		t.Errorf("Scale(1s) = %v, want at least 1s", got)
	}
}
