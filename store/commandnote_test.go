package store

import (
	"strings"
	"testing"
)

func TestCommandNoteReadsBackWhatItSends(t *testing.T) {
	for _, n := range []CommandNote{
		{ID: 7, Owner: "node-a/0f3c", TaskID: 42, ClaimSeq: 3, Kind: CommandStop},
		{ID: 8, Owner: "", TaskID: 43, ClaimSeq: 0, Kind: CommandPause},
		{ID: 9, Owner: "an owner with spaces", TaskID: 44, ClaimSeq: 12, Kind: CommandResume},
	} {
		got, err := ParseCommandNote(n.Payload())
		if err != nil || got != n {
			t.Errorf("ParseCommandNote(%q) = %+v, %v; want %+v", n.Payload(), got, err, n)
		}
	}
}

func TestCommandNoteRefusesPayloadsOfAnotherShape(t *testing.T) {
	for payload, want := range map[string]string{
		"7 node-a":               "want \"<command id> <owner> <task id> <claim_seq> <kind>\"",
		"x node-a 42 3 stop":     `command id "x" is not an integer`,
		"7 node-a 4x2 3 stop":    `task id "4x2" is not an integer`,
		"7 node-a 42 three stop": `claim_seq "three" is not an integer`,
	} {
		_, err := ParseCommandNote(payload)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCommandNote(%q): %v, want an error saying %s", payload, err, want)
		}
	}
}
