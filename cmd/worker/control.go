package main

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/commands"
)

// controlAction is what stop, pause and resume do through the client.
type controlAction func(c *flotilla.Client, cc *cli.Context, id int64, reason, by string) (commands.Result, error)

func stopCommand() *cli.Command {
	return controlCommand("stop", "stop a task: cancelled at once if it is not running, else its node stops it",
		true, func(c *flotilla.Client, cc *cli.Context, id int64, reason, by string) (commands.Result, error) {
			return c.Stop(cc.Context, id, flotilla.Reason(reason), flotilla.By(by))
		})
}

func pauseCommand() *cli.Command {
	return controlCommand("pause", "pause a task: at once if it waits to run, else at its handler's next checkpoint",
		false, func(c *flotilla.Client, cc *cli.Context, id int64, reason, by string) (commands.Result, error) {
			return c.Pause(cc.Context, id, flotilla.Reason(reason), flotilla.By(by))
		})
}

func resumeCommand() *cli.Command {
	return controlCommand("resume", "queue a paused task again",
		false, func(c *flotilla.Client, cc *cli.Context, id int64, reason, by string) (commands.Result, error) {
			return c.Resume(cc.Context, id, flotilla.Reason(reason), flotilla.By(by))
		})
}

func controlCommand(name, usage string, canWait bool, act controlAction) *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "reason", Usage: "why, recorded in the audit trail"},
		jsonFlag,
	}
	if canWait {
		flags = append(flags,
			&cli.BoolFlag{Name: "wait", Usage: "wait until the task's holder has applied the stop, and print the outcome"},
			&cli.DurationFlag{Name: "timeout", Value: time.Minute, Usage: "how long --wait waits"},
		)
	}
	return &cli.Command{
		Name:      name,
		Usage:     usage,
		ArgsUsage: "ID",
		Flags:     commonFlags(flags...),
		Action: func(c *cli.Context) error {
			args, err := positional(c)
			if err != nil {
				return err
			}
			if len(args) != 1 {
				return invalid(fmt.Errorf("%s takes one task ID, got %d arguments", name, len(args)))
			}
			id, err := parseTaskID(args[0])
			if err != nil {
				return err
			}
			if err := checkNameFlag(c, "reason", false); err != nil {
				return err
			}
			wait := canWait && c.Bool("wait")
			if canWait && c.Duration("timeout") <= 0 {
				return invalid(fmt.Errorf("--timeout %v is not positive: give how long --wait waits, e.g. 1m", c.Duration("timeout")))
			}
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			res, err := act(client, c, id, c.String("reason"), requester())
			if err != nil {
				return err
			}
			out := newControlJSON(res)
			if wait && !res.Direct() {
				ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
				defer cancel()
				cmd, status, err := client.WaitCommand(ctx, res.Command.ID, 0)
				if err != nil {
					return err
				}
				out.Status, out.Outcome, out.AckedBy = string(status), cmd.Outcome, cmd.AckedBy
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, out)
			}
			fmt.Fprintln(c.App.Writer, out.line())
			return nil
		},
	}
}

// requester names whoever issues a command, for the audit trail.
func requester() string {
	who := "worker"
	if u, err := user.Current(); err == nil && u.Username != "" {
		who = u.Username
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		who += "@" + host
	}
	return who
}

// controlJSON is the answer of stop, pause and resume.
type controlJSON struct {
	Task    int64  `json:"task"`
	Command string `json:"command"`
	// CommandID is the command issued for the task's node; 0 when the
	// change was made at once.
	CommandID int64  `json:"command_id,omitempty"`
	From      string `json:"from"`
	Status    string `json:"status"`
	Node      string `json:"node,omitempty"`
	Outcome   string `json:"outcome,omitempty"`
	AckedBy   string `json:"acked_by,omitempty"`
}

func newControlJSON(r commands.Result) controlJSON {
	return controlJSON{
		Task: r.TaskID, Command: r.Kind, CommandID: r.Command.ID,
		From: string(r.From), Status: string(r.Status), Node: r.Node,
	}
}

// line is the human answer, e.g. "task 42: stopped (was running on node a)".
func (o controlJSON) line() string {
	switch {
	case o.CommandID == 0 && o.From == o.Status:
		return fmt.Sprintf("task %d: already %s", o.Task, o.Status)
	case o.CommandID == 0:
		return fmt.Sprintf("task %d: %s (was %s)", o.Task, o.Status, o.From)
	case o.Outcome != "":
		return fmt.Sprintf("task %d: %s (was %s on node %s; acknowledged by %s: %s)",
			o.Task, o.Status, o.From, o.Node, o.AckedBy, o.Outcome)
	}
	return fmt.Sprintf("task %d: %s requested (command %d; it is %s on node %s)",
		o.Task, o.Command, o.CommandID, o.Status, o.Node)
}
