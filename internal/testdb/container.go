package testdb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

// ContainerImage is the image of the PostgreSQL container started when
// FLOTILLA_TEST_DSN is unset.
const ContainerImage = "postgres:15-alpine"

const (
	dockerCheckTimeout    = 30 * time.Second
	containerStartTimeout = 5 * time.Minute // includes pulling the image
	containerStopTimeout  = time.Minute
)

// server is this process's container, started on first use.
var server struct {
	mu      sync.Mutex
	tried   bool   // a start was attempted; never retried
	dsn     string // admin DSN of the running container
	err     error  // why there is no container to use
	ctr     *postgres.PostgresContainer
	started bool // a container was started at some point
}

var errTerminated = errors.New("the PostgreSQL container has already been terminated (testdb.Terminate)")

// containerDSN returns the admin DSN of this process's container, starting
// it on the first call.
func containerDSN() (string, error) {
	server.mu.Lock()
	defer server.mu.Unlock()
	if !server.tried {
		server.tried = true
		server.ctr, server.dsn, server.err = startContainer()
		server.started = server.ctr != nil
	}
	return server.dsn, server.err
}

func startContainer() (ctr *postgres.PostgresContainer, dsn string, err error) {
	if err := dockerReachable(); err != nil {
		return nil, "", fmt.Errorf("%s (%s is unset and Docker is not reachable: %v)", noServerMessage, EnvDSN, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), containerStartTimeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("start PostgreSQL container: %v", r)
		}
		if err != nil && ctr != nil {
			_ = terminate(ctr)
			ctr = nil
		}
	}()

	ctr, err = postgres.Run(ctx, ContainerImage, postgres.BasicWaitStrategies())
	if err != nil {
		return ctr, "", fmt.Errorf("start PostgreSQL container %s: %w", ContainerImage, err)
	}
	dsn, err = ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return ctr, "", fmt.Errorf("PostgreSQL container connection string: %w", err)
	}
	return ctr, dsn, nil
}

// dockerReachable reports whether testcontainers can use a Docker engine.
// testcontainers panics in some cases when there is none, hence the recover.
func dockerReachable() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), dockerCheckTimeout)
	defer cancel()

	provider, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return err
	}
	defer provider.Close()
	return provider.Health(ctx)
}

// Terminate stops and removes the PostgreSQL container of this process, if
// one was started; otherwise it does nothing. Calls to New after Terminate
// fail when they need the container. [Run] and [VerifyNoLeaks] call it.
//
// A container whose process dies without calling Terminate is removed by
// testcontainers' reaper (Ryuk) shortly afterwards, unless the reaper was
// disabled.
func Terminate() error {
	server.mu.Lock()
	defer server.mu.Unlock()
	server.tried = true
	if server.ctr == nil {
		if server.err == nil {
			server.err = errTerminated
		}
		return nil
	}
	ctr := server.ctr
	server.ctr, server.dsn, server.err = nil, "", errTerminated
	if err := terminate(ctr); err != nil {
		return fmt.Errorf("testdb: terminate PostgreSQL container: %w", err)
	}
	return nil
}

// terminate stops and removes ctr, giving up after containerStopTimeout.
func terminate(ctr *postgres.PostgresContainer) error {
	ctx, cancel := context.WithTimeout(context.Background(), containerStopTimeout)
	defer cancel()
	return testcontainers.TerminateContainer(ctr, testcontainers.StopContext(ctx))
}
