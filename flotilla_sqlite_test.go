package flotilla_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

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
	if _, err := c.SubmitTx(ctx, tx, flotilla.TaskRequest{Kind: "work", Key: "rolled-back"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	created, err := c.SubmitTx(ctx, tx, flotilla.TaskRequest{Kind: "work", Key: "committed"})
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

func TestSubmitTxOnSQLiteRefusesAnotherKindOfTransactionOrFile(t *testing.T) {
	ctx, _, c, _ := sqliteClient(t)
	if _, err := c.SubmitTx(ctx, "not a tx", flotilla.TaskRequest{Kind: "work", Key: "k"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("SubmitTx with a string: %v, want store.ErrInvalid", err)
	}
	_, _, _, otherDB := sqliteClient(t)
	tx, err := otherDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := c.SubmitTx(ctx, tx, flotilla.TaskRequest{Kind: "work", Key: "k"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("SubmitTx with a transaction on another file: %v, want store.ErrInvalid", err)
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
