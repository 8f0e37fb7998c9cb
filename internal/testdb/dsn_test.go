package testdb

import (
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	tests := []struct {
		dsn, want string
	}{
		{"", ""},
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"},
		{"postgres://user:secret@host:5432/db?sslmode=disable", "postgres://user@host:5432/db?sslmode=disable"},
		{"postgresql://user:secret@host/db", "postgresql://user@host/db"},
		{"postgres://user:p%40ss@host/db", "postgres://user@host/db"},
		{"postgres://user:p@ss:w/rd@host/db", "postgres://user@host/db"},
		{"postgres://user:secret@h1:5432,h2:5433/db?target_session_attrs=read-write", "postgres://user@h1:5432,h2:5433/db?target_session_attrs=read-write"},
		{"postgres://user:secret@[::1]:5432,[::1]:5433/db?target_session_attrs=read-write", "postgres://user@[::1]:5432,[::1]:5433/db?target_session_attrs=read-write"},
		{"postgres://user@h1,h2:5433/db?password=secret&target_session_attrs=read-write", "postgres://user@h1,h2:5433/db?target_session_attrs=read-write"},
		{"postgres://user@host/db?password=secret&sslmode=disable", "postgres://user@host/db?sslmode=disable"},
		{"postgres://user@host/db?sslmode=disable&pass%77ord=secret", "postgres://user@host/db?sslmode=disable"},
		{"postgres://user:secret@host", "postgres://user@host"},
		{"postgres://host/db", "postgres://host/db"},
		{"host=localhost user=u password=secret dbname=db", "host=localhost user=u dbname=db"},
		{"password=secret", ""},
		{"host=localhost password='sec ret' dbname=db", "host=localhost dbname=db"},
		{`host=localhost password='it\'s' dbname=db`, "host=localhost dbname=db"},
		{`host=localhost password=a\ b dbname=db`, "host=localhost dbname=db"},
		{"host = localhost password = secret  dbname = db", "host=localhost dbname=db"},
		{"host=localhost password='unterminated", "[unparseable DSN]"},
		{"not a dsn", "[unparseable DSN]"},
	}
	for _, tt := range tests {
		got := Redact(tt.dsn)
		if got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.dsn, got, tt.want)
		}
		if strings.Contains(got, "secret") || strings.Contains(got, "sec ret") {
			t.Errorf("Redact(%q) = %q still holds the password", tt.dsn, got)
		}
	}
}

func TestWithDatabase(t *testing.T) {
	tests := []struct {
		dsn, want string
	}{
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "postgres://postgres@127.0.0.1:5432/x?sslmode=disable"},
		{"postgres://u:p@h/test?sslmode=disable&application_name=a", "postgres://u:p@h/x?sslmode=disable&application_name=a"},
		{"postgresql://h1,h2/test", "postgresql://h1,h2/x"},
		{"postgres://h", "postgres://h/x"},
		{"postgres://h?sslmode=disable", "postgres://h/x?sslmode=disable"},
		{"host=h dbname=test sslmode=disable", "host=h sslmode=disable dbname=x"},
		{"host=h user='a b'", "host=h user='a b' dbname=x"},
		{"", "dbname=x"},
	}
	for _, tt := range tests {
		got, err := withDatabase(tt.dsn, "x")
		if err != nil || got != tt.want {
			t.Errorf("withDatabase(%q, x) = %q, %v; want %q", tt.dsn, got, err, tt.want)
		}
	}
	if _, err := withDatabase("host='h", "x"); err == nil {
		t.Error("withDatabase accepted an unterminated quote")
	}
}
