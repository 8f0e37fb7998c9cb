package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// Flags shared by the commands that use them (DESIGN §9).
var (
	dsnFlag = &cli.StringFlag{
		Name:    "dsn",
		Usage:   "PostgreSQL connection string, e.g. postgres://postgres@127.0.0.1:5432/flotilla",
		EnvVars: []string{"FLOTILLA_DSN"},
	}
	jsonFlag = &cli.BoolFlag{Name: "json", Usage: "print JSON instead of a table"}
)

func requireDSN(c *cli.Context) (string, error) {
	dsn := c.String(dsnFlag.Name)
	if dsn == "" {
		return "", invalid(fmt.Errorf("no database: give --dsn or set FLOTILLA_DSN " +
			"(e.g. postgres://postgres@127.0.0.1:5432/flotilla)"))
	}
	return dsn, nil
}

// positional returns a command's positional arguments after applying any
// flags written among or after them. urfave/cli stops parsing flags at the
// first positional argument and would silently treat `--json` in
// `worker get 7 --json` as a second argument; here it works, and an unknown
// flag is refused.
func positional(c *cli.Context) ([]string, error) {
	var args []string
	rest := c.Args().Slice()
	for i := 0; i < len(rest); i++ {
		tok := rest[i]
		if tok == "--" {
			args = append(args, rest[i+1:]...)
			break
		}
		if !strings.HasPrefix(tok, "-") || tok == "-" {
			args = append(args, tok)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(tok, "-"), "=")
		flag := lookupFlag(c.Command.Flags, name)
		if flag == nil {
			return nil, invalid(fmt.Errorf("unknown flag %q for %q", tok, c.Command.Name))
		}
		if _, isBool := flag.(*cli.BoolFlag); isBool && !hasValue {
			value = "true"
		} else if !hasValue {
			if i+1 >= len(rest) {
				return nil, invalid(fmt.Errorf("flag %q needs a value", tok))
			}
			i++
			value = rest[i]
		}
		if err := c.Set(name, value); err != nil {
			return nil, invalid(fmt.Errorf("invalid value %q for flag --%s: %w", value, name, err))
		}
	}
	return args, nil
}

func lookupFlag(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// noArgs applies any flags among a command's arguments and refuses the rest:
// the command takes none. hint, if given, suggests what was meant.
func noArgs(c *cli.Context, hint string) error {
	args, err := positional(c)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("%s takes no arguments, got %q", c.Command.Name, args)
	if hint != "" {
		msg += " (" + hint + ")"
	}
	return invalid(errors.New(msg))
}
