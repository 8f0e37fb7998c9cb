package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// maxSecretFile bounds a file that holds a secret: a connection string or a
// token is a line.
const maxSecretFile = 64 << 10

// readSecretFile reads a file named by flag that holds a secret (--dsn-file,
// --token-file), refusing one that its group or other users may read or
// write, as ssh refuses such a private key and libpq such a password file:
// a secret in a file anyone on the host can read is no secret, and the
// operator learns it now rather than after a leak. The error names the
// file, its mode and the fix, never the content.
func readSecretFile(flag, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) {
			err = pathErr.Err
		}
		return nil, invalid(fmt.Errorf("--%s %s cannot be read: %w", flag, path, err))
	}
	defer f.Close()
	info, err := f.Stat() // the file opened, not whatever the path names by now
	if err != nil {
		return nil, invalid(fmt.Errorf("--%s %s cannot be read: %w", flag, path, err))
	}
	if info.IsDir() {
		return nil, invalid(fmt.Errorf("--%s %s cannot be read: it is a directory", flag, path))
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return nil, invalid(fmt.Errorf("--%s %s has mode %04o: its group or other users may read or write it, "+
			"and it holds a secret; make it readable by its owner only (chmod 600 %s; in Kubernetes, a secret volume's "+
			"defaultMode: 0400)", flag, path, perm, path))
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, invalid(fmt.Errorf("--%s %s cannot be read: %w", flag, path, err))
	}
	if len(raw) > maxSecretFile {
		return nil, invalid(fmt.Errorf("--%s %s is over %d bytes: it should hold one line", flag, path, maxSecretFile))
	}
	return raw, nil
}
