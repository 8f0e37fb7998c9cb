package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/urfave/cli/v2"
)

// cliReference writes docs/cli.md: every command with its flags and their
// defaults, the exit statuses and the errors behind each, and the shape of
// every read command's JSON. It reads all of it from the command
// definitions, exitTable and jsonShapes, so the page cannot drift from
// the program; TestCLIReferenceIsCurrent fails when the file is stale.
func cliReference(w io.Writer) {
	app := newApp(io.Discard, io.Discard)
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }

	p("# worker command reference\n\n")
	p("<!-- Generated from the command definitions by `go test ./cmd/worker -run TestCLIReferenceIsCurrent -update`. Do not edit. -->\n\n")
	p("`worker` runs a node, and submits, inspects and controls tasks. `worker --help` and `worker COMMAND --help`\n")
	p("print the same as this page, command by command. Without `--dsn`, `--dsn-file` or `$%s`, a command uses\n", dsnEnv)
	p("the SQLite file `flotilla.db` in the working directory.\n\n")

	p("## Commands\n\n")
	p("| command | what it does |\n|---|---|\n")
	walkCommands(app.Commands, "", func(path string, c *cli.Command) {
		p("| [`worker %s`](#%s) | %s |\n", path, anchor("worker "+path), cellText(c.Usage))
	})

	p("\n## Exit status\n\n")
	p("Every command ends with one of these statuses. Under `--json`, an error is printed on stderr as\n")
	p("`{\"error\": \"...\", \"exit\": N}`. A `--` ends the options: what follows is an argument even if it starts with `-`.\n\n")
	p("| status | meaning | the errors that end with it |\n|---|---|---|\n")
	for _, s := range exitStatuses {
		var errs []string
		for _, row := range exitTable {
			if row.status == s.status {
				for _, e := range row.errs {
					if msg := cellText(e.Error()); !slices.Contains(errs, msg) {
						errs = append(errs, msg)
					}
				}
			}
		}
		switch {
		case s.status == exitOK:
			errs = []string{"none"}
		case s.status == exitRuntime:
			errs = []string{"any other"}
		}
		p("| %d | %s | %s |\n", s.status, cellText(s.meaning), strings.Join(errs, "; "))
	}

	walkCommands(app.Commands, "", func(path string, c *cli.Command) {
		p("\n## worker %s\n\n", path)
		p("%s.\n\n", sentence(c.Usage))
		usage := "worker " + path
		if len(c.Subcommands) > 0 {
			usage += " COMMAND"
		}
		if len(c.VisibleFlags()) > 0 {
			usage += " [options]"
		}
		if args := strings.TrimSpace(c.ArgsUsage); args != "" {
			usage += " " + args
		}
		p("```\n%s\n```\n\n", usage)
		if d := ownDescription(c.Description); d != "" {
			p("```text\n%s\n```\n\n", d)
		}
		if ex, ok := examples[path]; ok {
			p("Examples:\n\n```sh\n%s\n```\n\n", strings.Join(ex, "\n"))
		}
		if len(c.Subcommands) > 0 {
			p("Commands:")
			for _, sub := range c.Subcommands {
				p(" [`%s`](#%s)", sub.Name, anchor("worker "+path+" "+sub.Name))
			}
			p(".\n\n")
		}
		flags := c.VisibleFlags()
		if len(flags) == 0 {
			return
		}
		p("| flag | default | meaning |\n|---|---|---|\n")
		for _, f := range flags {
			name, def, usage := flagDoc(f)
			p("| `%s` | %s | %s |\n", name, def, cellText(usage))
		}
	})

	p("\n## JSON output\n\n")
	p("Under `--json`, the read commands print one JSON document each, of the shapes below. A script may rely on\n")
	p("every field named here, with its type, and on no other; a field marked optional is left out when empty.\n")
	p("Times are RFC 3339 in UTC with exactly six digits of fraction (microseconds, what every store keeps), so that\n")
	p("every time has one width, e.g. `2026-01-02T15:04:05.120000Z`; or null when there is none.\n")
	for _, s := range jsonShapes {
		p("\n### worker %s --json\n\n", s.Command)
		if s.Array {
			p("An array of objects, each with:\n\n")
		} else {
			p("An object with:\n\n")
		}
		p("| field | type | always there | meaning |\n|---|---|---|---|\n")
		writeFields(w, "", s.Fields)
	}
}

func writeFields(w io.Writer, prefix string, fields []jsonField) {
	for _, f := range fields {
		always := "yes"
		if !f.Required {
			always = "optional"
		}
		fmt.Fprintf(w, "| `%s%s` | %s | %s | %s |\n", prefix, f.Name, f.Type, always, cellText(f.Meaning))
		writeFields(w, prefix+f.Name+"[].", f.Fields)
	}
}

// walkCommands calls fn for every command and subcommand, with its path as
// typed after "worker", in the order of the help.
func walkCommands(cmds []*cli.Command, parent string, fn func(path string, c *cli.Command)) {
	for _, c := range cmds {
		if c.Hidden {
			continue
		}
		path := strings.TrimSpace(parent + " " + c.Name)
		fn(path, c)
		walkCommands(c.Subcommands, path, fn)
	}
}

// ownDescription is a command's description without what document added:
// its examples and the exit statuses, which the reference shows once.
func ownDescription(d string) string {
	for _, cut := range []string{"Examples:\n", exitStatusHelp} {
		if i := strings.Index(d, cut); i >= 0 {
			d = d[:i]
		}
	}
	return strings.TrimSpace(d)
}

// flagDoc gives a flag's names, its default and its usage as the reference
// shows them.
func flagDoc(f cli.Flag) (names, def, usage string) {
	var spelled []string
	for _, n := range f.Names() {
		if len(n) == 1 {
			spelled = append(spelled, "-"+n)
		} else {
			spelled = append(spelled, "--"+n)
		}
	}
	names = strings.Join(spelled, ", ")
	def = "none"
	if df, ok := f.(cli.DocGenerationFlag); ok {
		usage = df.GetUsage()
		if df.TakesValue() {
			names += " VALUE"
		}
		switch {
		case df.GetDefaultText() != "":
			def = df.GetDefaultText()
		case !df.TakesValue():
			def = "false"
		case df.GetValue() != "" && df.GetValue() != `""`:
			def = df.GetValue()
		}
		if sf, ok := f.(cli.DocGenerationSliceFlag); ok && sf.IsSliceFlag() && !strings.Contains(usage, "repeatable") {
			usage += " (repeatable)"
		}
	}
	return names, cellText(def), usage
}

// sentence is a usage line as a sentence: a capital first, no full stop,
// which the caller adds.
func sentence(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToUpper(r)) + strings.TrimSuffix(s[n:], ".")
}

// anchor is the fragment GitHub gives a heading.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// cellText makes text safe in a Markdown table cell.
func cellText(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}
