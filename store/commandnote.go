package store

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// CommandNote is what a TopicCommands notification says about the command
// it announces: enough for the node running the task to act on a stop the
// moment it hears of it, before it reads the command row, and to say in the
// task's trail who asked and why. The payload is
//
//	<command id> <owner> <task id> <claim_seq> <kind> <issued at> <issued by> <reason>
//
// the owner empty unless the task was active when the command was issued,
// the issue time in microseconds since the Unix epoch by the store's clock
// (the node times the command's delivery from it, as it does from the
// row's), and who issued it and why as the hexadecimal of their UTF-8, each
// cut to its first NoteTextRunes characters so that a note always fits in a
// notification (PostgreSQL refuses payloads of 8,000 bytes or more).
//
// The note is a hint, like every notification: the command row is still
// read, applied under the task's fence and acknowledged. A node acts on a
// note only for the attempt it names (task id and claim_seq), owned by its
// own incarnation, so a note that arrives late, after the task moved on, is
// about an attempt the node no longer runs and changes nothing.
type CommandNote struct {
	ID       int64
	Owner    string
	TaskID   int64
	ClaimSeq int64
	Kind     string
	IssuedAt time.Time
	IssuedBy string
	Reason   string
}

// NoteTextRunes is how many characters of a command's issuer and reason
// its note carries. The command row keeps them whole.
const NoteTextRunes = 250

// noteText is s cut to its first NoteTextRunes characters, as PostgreSQL's
// left(s, NoteTextRunes) cuts it.
func noteText(s string) string {
	if utf8.RuneCountInString(s) <= NoteTextRunes {
		return s
	}
	return string([]rune(s)[:NoteTextRunes])
}

// Payload is the note as sent.
func (n CommandNote) Payload() string {
	return fmt.Sprintf("%d %s %d %d %s %d %s %s", n.ID, n.Owner, n.TaskID, n.ClaimSeq, n.Kind, n.IssuedAt.UnixMicro(),
		hex.EncodeToString([]byte(noteText(n.IssuedBy))), hex.EncodeToString([]byte(noteText(n.Reason))))
}

// ParseCommandNote reads a TopicCommands payload. The owner is taken as
// everything between the first field and the last six, so an owner with
// spaces in it reads back whole.
func ParseCommandNote(payload string) (CommandNote, error) {
	f := strings.Split(payload, " ")
	if len(f) < 8 {
		return CommandNote{}, fmt.Errorf("command note %q: want \"<command id> <owner> <task id> <claim_seq> <kind> "+
			"<issued at> <issued by> <reason>\"", payload)
	}
	var n CommandNote
	var err error
	var issued int64
	last := len(f) - 1
	for _, field := range []struct {
		name string
		text string
		into *int64
	}{{"command id", f[0], &n.ID}, {"task id", f[last-5], &n.TaskID}, {"claim_seq", f[last-4], &n.ClaimSeq},
		{"issue time", f[last-2], &issued}} {
		if *field.into, err = strconv.ParseInt(field.text, 10, 64); err != nil {
			return CommandNote{}, fmt.Errorf("command note %q: %s %q is not an integer", payload, field.name, field.text)
		}
	}
	for _, field := range []struct {
		name string
		text string
		into *string
	}{{"issued by", f[last-1], &n.IssuedBy}, {"reason", f[last], &n.Reason}} {
		b, err := hex.DecodeString(field.text)
		if err != nil {
			return CommandNote{}, fmt.Errorf("command note %q: %s %q is not hexadecimal", payload, field.name, field.text)
		}
		*field.into = string(b)
	}
	n.Owner = strings.Join(f[1:last-5], " ")
	n.Kind = f[last-3]
	n.IssuedAt = time.UnixMicro(issued)
	return n, nil
}
