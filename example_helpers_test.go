package flotilla_test

import (
	"database/sql"
	"strings"

	"github.com/flotilla-dev/flotilla/flotillatest"
	"github.com/flotilla-dev/flotilla/internal/exampletb"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/node"
)

// exampleT is the *testing.T an example has none of (see package
// exampletb).
type exampleT = exampletb.TB

// appDB is the application's own handle on an SQLite fleet's file, as an
// application that submits in its transactions opens it: they begin
// IMMEDIATE, as a writer's must on SQLite.
func appDB(dsn string) *sql.DB {
	db, err := sql.Open("sqlite", "file:"+strings.TrimPrefix(dsn, "sqlite:")+"?_txlock=immediate&_pragma=busy_timeout(10000)")
	if err != nil {
		panic(err)
	}
	return db
}

// exampleFleet is a fleet of one node on an SQLite file in a temporary
// directory, running the handlers register registers: the setup most
// examples share (see ExampleHandle for it written out). done shuts it down
// and removes the file.
func exampleFleet(register func(n *node.Node) error, opts ...flotillatest.FleetOption) (fleet *flotillatest.Fleet, done func()) {
	t := &exampleT{}
	return flotillatest.NewFleet(t, register, opts...), t.Done
}

// postgresDSN is a new, empty PostgreSQL database on the test server, which
// done drops: the examples of the calls that take a pgx.Tx run on it. An
// example cannot be skipped, so those examples end in _postgres, and
// `make test-short` leaves them out by that name (-skip).
func postgresDSN() (dsn string, done func()) {
	t := &exampleT{}
	return testdb.New(t), t.Done
}
