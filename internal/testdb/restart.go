package testdb

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// containerRestartStop is how long a restart lets the server shut down
// before Docker kills it.
const containerRestartStop = 30 * time.Second

// RestartContainer stops this process's PostgreSQL container and starts it
// again, waiting until it accepts connections: a server restart, which
// breaks every open connection. It returns the admin DSN afterwards, since
// Docker may publish the server's port anew; later calls to New use it.
// It fails when no container was started (FLOTILLA_TEST_DSN names the
// server): restarting that one is the caller's business.
func RestartContainer(ctx context.Context) (string, error) {
	server.mu.Lock()
	defer server.mu.Unlock()
	if server.ctr == nil {
		return "", errors.New("testdb: no PostgreSQL container of this process to restart")
	}
	stop := containerRestartStop
	if err := server.ctr.Stop(ctx, &stop); err != nil {
		return "", fmt.Errorf("testdb: stop the PostgreSQL container: %w", err)
	}
	if err := server.ctr.Start(ctx); err != nil {
		return "", fmt.Errorf("testdb: start the PostgreSQL container again: %w", err)
	}
	dsn, err := server.ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", fmt.Errorf("testdb: PostgreSQL container connection string: %w", err)
	}
	server.dsn = dsn
	return dsn, nil
}
