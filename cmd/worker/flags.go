package main

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/urfave/cli/v2"

	storedsn "github.com/flotilla-dev/flotilla/store/dsn"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

// Flags shared by the commands that use them (DESIGN §9).
var (
	dsnFlag = &cli.StringFlag{
		Name: "dsn",
		Usage: "the fleet's database: an SQLite file (sqlite:PATH, or a path ending in .db) or a PostgreSQL URL, " +
			"e.g. postgres://postgres@127.0.0.1:5432/flotilla. Every user of the host can read a command line: " +
			"give a password through $" + dsnEnv + " or --dsn-file instead",
		DefaultText: "$" + dsnEnv + ", else " + storedsn.Default,
	}
	dsnFileFlag = &cli.StringFlag{
		Name: "dsn-file",
		Usage: "read the database (an SQLite file or a PostgreSQL URL, as --dsn) from this file (surrounding whitespace " +
			"is ignored); refused unless only its owner may read it (chmod 600)",
	}
	jsonFlag = &cli.BoolFlag{Name: "json", Usage: "print JSON instead of a table"}
)

// dsnEnv stands in for --dsn. It is read by lookupDSN rather than declared
// on the flag, so that a command can tell a connection string typed on the
// command line (readable by every user of the host) from one that is not.
const dsnEnv = "FLOTILLA_DSN"

// dsnOrigin says where a command's connection string came from.
type dsnOrigin int

const (
	dsnMissing dsnOrigin = iota
	dsnFromFlag
	dsnFromFile
	dsnFromEnv
	dsnDefault // none given: dsn.Default
)

// lookupDSN returns the connection string given by --dsn, --dsn-file or
// $FLOTILLA_DSN, in that order, and where it came from; "" and dsnMissing
// when none gives one. Giving both flags is invalid. No error repeats the
// connection string: it may hold a password.
func lookupDSN(c *cli.Context) (string, dsnOrigin, error) {
	fromFlag, fromFile := c.IsSet(dsnFlag.Name), c.IsSet(dsnFileFlag.Name)
	switch {
	case fromFlag && fromFile:
		return "", dsnMissing, invalid(errors.New("--dsn and --dsn-file both give the connection string: give one of them"))
	case fromFile:
		path := c.String(dsnFileFlag.Name)
		raw, err := readSecretFile(dsnFileFlag.Name, path)
		if err != nil {
			return "", dsnMissing, err
		}
		dsn := strings.TrimSpace(string(raw))
		if dsn == "" {
			return "", dsnMissing, invalid(fmt.Errorf("--dsn-file %s is empty: it should hold a connection string such as %s", path, exampleDSN))
		}
		return dsn, dsnFromFile, nil
	case fromFlag:
		dsn := c.String(dsnFlag.Name)
		if dsn == "" {
			return "", dsnMissing, invalid(fmt.Errorf("--dsn is empty: give a connection string such as %s", exampleDSN))
		}
		return dsn, dsnFromFlag, nil
	}
	if dsn := os.Getenv(dsnEnv); dsn != "" {
		return dsn, dsnFromEnv, nil
	}
	return "", dsnMissing, nil
}

const exampleDSN = "postgres://postgres@127.0.0.1:5432/flotilla"

// requireDSN is lookupDSN for the commands that cannot go without a
// database: with none given they use dsn.Default, the SQLite file
// flotilla.db in the working directory, and say so once on stderr. A DSN of
// no accepted form is invalid input, named without its password.
func requireDSN(c *cli.Context) (string, storedsn.Target, error) {
	raw, target, origin, err := requireDSNFrom(c)
	if err == nil && origin == dsnDefault {
		fmt.Fprintf(c.App.ErrWriter, "no --dsn, --dsn-file or $%s: using the SQLite file %s\n", dsnEnv, target.Path)
	}
	return raw, target, err
}

// requireDSNFrom is requireDSN that says nothing and tells where the DSN
// came from: `worker run` logs the default store instead.
func requireDSNFrom(c *cli.Context) (string, storedsn.Target, dsnOrigin, error) {
	raw, origin, err := lookupDSN(c)
	if err != nil {
		return "", storedsn.Target{}, dsnMissing, err
	}
	if origin == dsnMissing {
		raw, origin = storedsn.Default, dsnDefault
	}
	target, err := storedsn.Parse(raw)
	if err != nil {
		return "", storedsn.Target{}, dsnMissing, invalid(err)
	}
	return raw, target, origin, nil
}

// hasPassword reports whether a connection string, URL or keyword/value,
// carries a password: for a URL, whether redacting it removes anything.
// net/url is not used: it refuses the multi-host form of an HA PostgreSQL
// with IPv6 hosts (postgres://[::1]:5432,[::1]:5433/db), and took it to
// have a password.
func hasPassword(dsn string) bool {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return postgres.Redact(dsn) != dsn
	}
	return passwordKeyword.MatchString(dsn)
}

// passwordKeyword finds the password keyword of a keyword/value connection
// string ("host=db password=...").
var passwordKeyword = regexp.MustCompile(`(^|\s)password\s*=`)

// positional returns a command's positional arguments after applying any
// flags written among or after them. urfave/cli stops parsing flags at the
// first positional argument and would silently treat `--json` in
// `worker get 7 --json` as a second argument; here it works, and an unknown
// flag is refused.
//
// A "--" ends the flags: what follows is an argument even if it starts with
// "-". urfave/cli drops a "--" that comes before any argument, so run counts
// the arguments after the first "--" of the command line (literalArgs), and
// those last arguments are taken as they are.
func positional(c *cli.Context) ([]string, error) {
	var args []string
	rest := c.Args().Slice()
	literal := literalArgs(c)
	if literal > len(rest) {
		literal = len(rest)
	}
	rest, tail := rest[:len(rest)-literal], rest[len(rest)-literal:]
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
	return append(args, tail...), nil
}

// literalArgsKey is where run leaves, in the app's metadata, the number of
// arguments after the command line's first "--".
const literalArgsKey = "literal-args"

func literalArgs(c *cli.Context) int {
	n, _ := c.App.Metadata[literalArgsKey].(int)
	return n
}

// countLiteralArgs counts the arguments after the first "--".
func countLiteralArgs(args []string) int {
	for i, a := range args {
		if a == "--" {
			return len(args) - i - 1
		}
	}
	return 0
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
