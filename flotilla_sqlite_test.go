package flotilla_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/sqlite"
)

// sqliteClient opens a migrated SQLite store on a new file and a client on
// it, and a database/sql handle of the caller's own on the same file.
func sqliteClient(t *testing.T) (context.Context, *sqlite.Store, *flotilla.Client, *sql.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	path := filepath.Join(t.TempDir(), "fleet.db")
	s, err := sqlite.New(ctx, path, sqlite.WithOutboxPoll(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(ctx, 0); err != nil {
		t.Fatal(err)
	}
	c, err := flotilla.NewClient(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return ctx, s, c, db
}

func TestSubmitTxOnSQLiteFollowsTheCallersTransaction(t *testing.T) {
	ctx, s, c, db := sqliteClient(t)
	sub, err := s.Listen(ctx, store.TopicTasks)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitSQLiteTx(ctx, tx, flotilla.TaskRequest{Kind: "work", Key: "rolled-back"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	created, err := c.SubmitSQLiteTx(ctx, tx, flotilla.TaskRequest{Kind: "work", Key: "committed"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	list, err := c.List(ctx, store.TaskFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Key != "committed" {
		t.Fatalf("after a rollback and a commit: %+v", list)
	}
	// The rolled-back announcement never reaches listeners; the committed
	// one does, through the outbox.
	select {
	case n := <-sub.C():
		if want := created[0].Bucket; n.Payload != bucketString(want) {
			t.Errorf("notification %+v, want the committed task's bucket %d", n, want)
		}
	case <-time.After(patience.Scale(30 * time.Second)):
		t.Fatal("no notification of the committed task")
	}
}

// TestSubmitTxTakesEachDatabasesTransactionType holds the signatures that
// make the wrong kind of transaction a compile error: SubmitTx and
// SubmitPipelineTx take a pgx.Tx, their SQLite forms a *sql.Tx.
func TestSubmitTxTakesEachDatabasesTransactionType(t *testing.T) {
	pgxTx, sqlTx := reflect.TypeFor[pgx.Tx](), reflect.TypeFor[*sql.Tx]()
	for _, m := range []struct {
		name string
		fn   any
		want reflect.Type
	}{
		{"Client.SubmitTx", (*flotilla.Client).SubmitTx, pgxTx},
		{"Client.SubmitPipelineTx", (*flotilla.Client).SubmitPipelineTx, pgxTx},
		{"Client.SubmitSQLiteTx", (*flotilla.Client).SubmitSQLiteTx, sqlTx},
		{"Client.SubmitPipelineSQLiteTx", (*flotilla.Client).SubmitPipelineSQLiteTx, sqlTx},
		{"SubmitArgsTx", flotilla.SubmitArgsTx[greeting], pgxTx},
		{"SubmitArgsSQLiteTx", flotilla.SubmitArgsSQLiteTx[greeting], sqlTx},
	} {
		fn := reflect.TypeOf(m.fn)
		found := false
		for i := range fn.NumIn() {
			found = found || fn.In(i) == m.want
			if fn.In(i).Kind() == reflect.Interface && fn.In(i).NumMethod() == 0 {
				t.Errorf("%s takes an %v: the compiler cannot check what is passed", m.name, fn.In(i))
			}
		}
		if !found {
			t.Errorf("%s is %v: it takes no %v", m.name, fn, m.want)
		}
	}
}

func TestSubmitSQLiteTxRefusesATransactionOnAnotherFile(t *testing.T) {
	ctx, _, c, _ := sqliteClient(t)
	_, _, _, otherDB := sqliteClient(t)
	tx, err := otherDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := c.SubmitSQLiteTx(ctx, tx, flotilla.TaskRequest{Kind: "work", Key: "k"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("SubmitSQLiteTx with a transaction on another file: %v, want store.ErrInvalid", err)
	}
}

func TestConnectPicksTheStoreByDSN(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "fleet.db")
	s, err := sqlite.New(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Migrate(ctx, 16); err != nil {
		t.Fatal(err)
	}
	s.Close()
	for _, dsn := range []string{"sqlite:" + path, path} {
		c, err := flotilla.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("Connect(%q): %v", dsn, err)
		}
		if _, err := c.Submit(ctx, flotilla.TaskRequest{Kind: "work", Key: "k"}, flotilla.AllowUnowned(), flotilla.AllowUnknownKind()); err != nil {
			t.Errorf("Submit through Connect(%q): %v", dsn, err)
		}
		c.Close()
	}
	if _, err := flotilla.Connect(ctx, "mysql://u@h/db"); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Connect with a MySQL URL: %v, want store.ErrInvalid", err)
	}
}

func bucketString(b int) string { return bucket.Of(b).String() }

// greeting is a task type of the tests.
type greeting struct {
	Name string `json:"name"`
}

func (greeting) Kind() string { return "greet" }
