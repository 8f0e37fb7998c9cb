package flotilla

import (
	"context"

	"github.com/flotilla-dev/flotilla/commands"
)

// CommandOption describes a request to stop, pause or resume, for the
// task's audit trail: Reason and By. Every control call takes them, on one
// task (Stop, Pause, Resume) or on a pipeline (StopPipeline, ...).
type CommandOption func(*commandOptions)

type commandOptions struct {
	reason, by string
}

func newCommandOptions(opts []CommandOption) commandOptions {
	var o commandOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Reason says why, in the audit trail: "stop requested: <why>".
func Reason(why string) CommandOption { return func(o *commandOptions) { o.reason = why } }

// By names who asked, in the audit trail: "stop requested by <who>".
func By(who string) CommandOption { return func(o *commandOptions) { o.by = who } }

// Stop stops task id: at once when no node runs it (-> cancelled), through
// the command channel when one does (-> stopping -> stopped). It returns once
// the request is recorded; WaitCommand waits for a command's outcome. A
// finished task is *commands.TooLateError; a missing one matches
// store.ErrNotFound.
func (c *Client) Stop(ctx context.Context, id int64, opts ...CommandOption) (commands.Result, error) {
	o := newCommandOptions(opts)
	return commands.Stop(ctx, c.store, id, o.reason, o.by)
}

// Pause pauses task id: at once when it waits to run, at its handler's next
// checkpoint when it runs.
func (c *Client) Pause(ctx context.Context, id int64, opts ...CommandOption) (commands.Result, error) {
	o := newCommandOptions(opts)
	return commands.Pause(ctx, c.store, id, o.reason, o.by)
}

// Resume queues paused task id again.
func (c *Client) Resume(ctx context.Context, id int64, opts ...CommandOption) (commands.Result, error) {
	o := newCommandOptions(opts)
	return commands.Resume(ctx, c.store, id, o.reason, o.by)
}
