package store

import (
	"strings"
	"testing"
	"time"
)

func TestCommandNoteReadsBackWhatItSends(t *testing.T) {
	for _, n := range []CommandNote{
		{ID: 7, Owner: "node-a/0f3c", TaskID: 42, ClaimSeq: 3, Kind: CommandStop, IssuedAt: time.UnixMicro(1764633600123456),
			IssuedBy: "ui:operator", Reason: "wrong order"},
		{ID: 8, Owner: "", TaskID: 43, ClaimSeq: 0, Kind: CommandPause, IssuedAt: time.UnixMicro(0)},
		{ID: 9, Owner: "an owner with spaces", TaskID: 44, ClaimSeq: 12, Kind: CommandResume, IssuedAt: time.UnixMicro(1),
			IssuedBy: "ops with spaces", Reason: "a reason with spaces,\nlines and ünïcode"},
	} {
		got, err := ParseCommandNote(n.Payload())
		if err != nil || got.ID != n.ID || got.Owner != n.Owner || got.TaskID != n.TaskID || got.ClaimSeq != n.ClaimSeq ||
			got.Kind != n.Kind || !got.IssuedAt.Equal(n.IssuedAt) || got.IssuedBy != n.IssuedBy || got.Reason != n.Reason {
			t.Errorf("ParseCommandNote(%q) = %+v, %v; want %+v", n.Payload(), got, err, n)
		}
	}
}

func TestCommandNoteRefusesPayloadsOfAnotherShape(t *testing.T) {
	for payload, want := range map[string]string{
		"7 node-a":                     "want \"<command id> <owner> <task id> <claim_seq> <kind> <issued at> <issued by> <reason>\"",
		"7 node-a 42 3 stop 1":         "want \"<command id> <owner> <task id> <claim_seq> <kind> <issued at> <issued by> <reason>\"",
		"x node-a 42 3 stop 1 6f 6f":   `command id "x" is not an integer`,
		"7 node-a 4x2 3 stop 1 6f 6f":  `task id "4x2" is not an integer`,
		"7 node-a 42 three stop 1 6f ": `claim_seq "three" is not an integer`,
		"7 node-a 42 3 stop now 6f 6f": `issue time "now" is not an integer`,
		"7 node-a 42 3 stop 1 ops 6f":  `issued by "ops" is not hexadecimal`,
		"7 node-a 42 3 stop 1 6f why":  `reason "why" is not hexadecimal`,
	} {
		_, err := ParseCommandNote(payload)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCommandNote(%q): %v, want an error saying %s", payload, err, want)
		}
	}
}

// TestCommandNoteCarriesTheStartOfALongReason: a note must fit in a
// notification whatever the reason's length; the command row keeps it whole.
func TestCommandNoteCarriesTheStartOfALongReason(t *testing.T) {
	long := strings.Repeat("é", 3*NoteTextRunes)
	n := CommandNote{ID: 1, Owner: "a/1", TaskID: 2, ClaimSeq: 3, Kind: CommandStop, IssuedBy: long, Reason: long}
	p := n.Payload()
	if len(p) >= 8000 {
		t.Fatalf("a note of %d bytes: PostgreSQL refuses notifications of 8,000 bytes or more", len(p))
	}
	got, err := ParseCommandNote(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Repeat("é", NoteTextRunes); got.Reason != want || got.IssuedBy != want {
		t.Errorf("the note carries %d and %d characters, want the first %d of each",
			len([]rune(got.IssuedBy)), len([]rune(got.Reason)), NoteTextRunes)
	}
}
