package store

import (
	"strings"
	"testing"
	"time"
)

func TestCommandNoteReadsBackWhatItSends(t *testing.T) {
	for _, n := range []CommandNote{
		{ID: 7, Owner: "node-a/0f3c", TaskID: 42, ClaimSeq: 3, Kind: CommandStop, IssuedAt: time.UnixMicro(1764633600123456)},
		{ID: 8, Owner: "", TaskID: 43, ClaimSeq: 0, Kind: CommandPause, IssuedAt: time.UnixMicro(0)},
		{ID: 9, Owner: "an owner with spaces", TaskID: 44, ClaimSeq: 12, Kind: CommandResume, IssuedAt: time.UnixMicro(1)},
	} {
		got, err := ParseCommandNote(n.Payload())
		if err != nil || got.ID != n.ID || got.Owner != n.Owner || got.TaskID != n.TaskID || got.ClaimSeq != n.ClaimSeq ||
			got.Kind != n.Kind || !got.IssuedAt.Equal(n.IssuedAt) {
			t.Errorf("ParseCommandNote(%q) = %+v, %v; want %+v", n.Payload(), got, err, n)
		}
	}
}

func TestCommandNoteRefusesPayloadsOfAnotherShape(t *testing.T) {
	for payload, want := range map[string]string{
		"7 node-a":                 "want \"<command id> <owner> <task id> <claim_seq> <kind> <issued at>\"",
		"7 node-a 42 3 stop":       "want \"<command id> <owner> <task id> <claim_seq> <kind> <issued at>\"",
		"x node-a 42 3 stop 1":     `command id "x" is not an integer`,
		"7 node-a 4x2 3 stop 1":    `task id "4x2" is not an integer`,
		"7 node-a 42 three stop 1": `claim_seq "three" is not an integer`,
		"7 node-a 42 3 stop now":   `issue time "now" is not an integer`,
	} {
		_, err := ParseCommandNote(payload)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCommandNote(%q): %v, want an error saying %s", payload, err, want)
		}
	}
}
