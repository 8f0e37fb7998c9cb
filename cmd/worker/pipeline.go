package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/kinds"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// pipelineFile is the format of `worker pipeline submit FILE.json`
// (docs/pipelines.md has it whole, with a worked example a test runs):
//
//	{"name": "nightly", "key": "tenant-7", "tasks": [
//	  {"name": "fetch", "kind": "sleep", "payload": {"duration": "10ms"}},
//	  {"name": "report", "kind": "noop", "depends_on": ["fetch"], "on": "success"}]}
//
// "key" is optional (default: the name plus the pipeline's id); each task
// has a name unique in the file, a kind, and optionally a payload (any
// JSON), priority, max_attempts, timeout (a Go duration, "30s"),
// depends_on (names of other tasks of the file) and on, the policy for all
// of its dependencies: "success" (the default), "any" or "failure". Unknown
// keys, keys given twice and keys in another case are refused
// (checkPipelineKeys), and so is a file over maxPipelineFileBytes.
type pipelineFile struct {
	Name  string             `json:"name"`
	Key   string             `json:"key"`
	Tasks []pipelineFileTask `json:"tasks"`
}

type pipelineFileTask struct {
	Name        string          `json:"name"`
	Kind        string          `json:"kind"`
	Payload     json.RawMessage `json:"payload"`
	Priority    int             `json:"priority"`
	MaxAttempts int             `json:"max_attempts"`
	Timeout     string          `json:"timeout"`
	DependsOn   []string        `json:"depends_on"`
	On          string          `json:"on"`
}

// parsePipeline reads and checks a pipeline file; every error is invalid
// input, naming the problem.
func parsePipeline(r io.Reader, source string) (flotilla.PipelineRequest, error) {
	body, err := readPipelineFile(r, source)
	if err != nil {
		return flotilla.PipelineRequest{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var f pipelineFile
	if err := dec.Decode(&f); err != nil {
		return flotilla.PipelineRequest{}, fmt.Errorf("%s: not a pipeline file: %w", source, err)
	}
	if dec.More() {
		return flotilla.PipelineRequest{}, fmt.Errorf("%s: more than one JSON document", source)
	}
	if err := checkPipelineKeys(body); err != nil {
		return flotilla.PipelineRequest{}, fmt.Errorf("%s: %w", source, err)
	}
	if strings.TrimSpace(f.Name) == "" {
		return flotilla.PipelineRequest{}, fmt.Errorf(`%s: the pipeline has no "name"`, source)
	}
	req := flotilla.PipelineRequest{Name: f.Name, Key: f.Key}
	for i, t := range f.Tasks {
		s := task.Step{Name: t.Name, Kind: t.Kind, Payload: t.Payload, Priority: t.Priority, MaxAttempts: t.MaxAttempts}
		if t.Timeout != "" {
			d, err := time.ParseDuration(t.Timeout)
			if err != nil {
				return flotilla.PipelineRequest{}, fmt.Errorf("%s: task %d (%q): timeout %q is not a duration such as 30s", source, i, t.Name, t.Timeout)
			}
			s.Timeout = d
		}
		if t.On != "" && len(t.DependsOn) == 0 {
			return flotilla.PipelineRequest{}, fmt.Errorf(`%s: task %q has "on": %q but no "depends_on"`, source, t.Name, t.On)
		}
		for _, d := range t.DependsOn {
			s.DependsOn = append(s.DependsOn, task.Dependency{Step: d, On: t.On})
		}
		req.Steps = append(req.Steps, s)
	}
	if _, err := store.CheckNewPipeline(store.NewPipeline{Name: req.Name, Key: req.Key, Steps: req.Steps}); err != nil {
		return flotilla.PipelineRequest{}, fmt.Errorf("%s: %w", source, err)
	}
	// A step of a stock kind is held to the payload check worker submit
	// applies, so that it fails here, not attempt after attempt on a node.
	for _, s := range req.Steps {
		if err := kinds.CheckPayload(s.Kind, s.Payload); err != nil {
			return flotilla.PipelineRequest{}, fmt.Errorf("%s: step %q: %w", source, s.Name, err)
		}
	}
	return req, nil
}

func pipelineCommand() *cli.Command {
	return &cli.Command{
		Name:  "pipeline",
		Usage: "submit, show, retry, stop, pause and resume pipelines: tasks that wait for other tasks",
		Subcommands: []*cli.Command{
			pipelineSubmitCommand(),
			pipelineGetCommand(),
			pipelineRetryCommand(),
			pipelineControlCommand("stop",
				"stop every unfinished step, dependents first: waiting ones (clean-up steps included) are cancelled at once, running ones are stopped by their node",
				func(c *flotilla.Client, cc *cli.Context, id int64, reason, by string) ([]flotilla.PipelineStepResult, error) {
					return c.StopPipeline(cc.Context, id, flotilla.Reason(reason), flotilla.By(by))
				}),
			pipelineControlCommand("pause",
				"pause every unfinished step: waiting and pending ones at once, running ones at their next checkpoint",
				func(c *flotilla.Client, cc *cli.Context, id int64, reason, by string) ([]flotilla.PipelineStepResult, error) {
					return c.PausePipeline(cc.Context, id, flotilla.Reason(reason), flotilla.By(by))
				}),
			pipelineControlCommand("resume",
				"resume every paused step: queued if its dependencies have ended, else pending again",
				func(c *flotilla.Client, cc *cli.Context, id int64, reason, by string) ([]flotilla.PipelineStepResult, error) {
					return c.ResumePipeline(cc.Context, id, flotilla.Reason(reason), flotilla.By(by))
				}),
		},
	}
}

// pipelineControlAction is what pipeline stop, pause and resume do through
// the client.
type pipelineControlAction func(c *flotilla.Client, cc *cli.Context, id int64, reason, by string) ([]flotilla.PipelineStepResult, error)

// pipelineControlCommand is `worker pipeline stop|pause|resume ID`: the
// per-task request applied to each step it concerns, one line per step
// acted on.
func pipelineControlCommand(name, usage string, act pipelineControlAction) *cli.Command {
	return &cli.Command{
		Name:      name,
		Usage:     usage,
		ArgsUsage: "ID",
		Flags: commonFlags(
			&cli.StringFlag{Name: "reason", Usage: "why, recorded in each step's audit trail"},
			jsonFlag,
		),
		Action: func(c *cli.Context) error {
			id, err := pipelineID(c)
			if err != nil {
				return err
			}
			if err := checkNameFlag(c, "reason", false); err != nil {
				return err
			}
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			rs, err := act(client, c, id, c.String("reason"), requester())
			if err != nil {
				return err
			}
			out := pipelineControlJSON{Pipeline: id, Steps: []pipelineStepControlJSON{}}
			for _, r := range rs {
				out.Steps = append(out.Steps, pipelineStepControlJSON{Step: r.Step, controlJSON: newControlJSON(r.Result)})
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, out)
			}
			if len(out.Steps) == 0 {
				fmt.Fprintf(c.App.Writer, "pipeline %d: no step to %s\n", id, name)
			}
			for _, s := range out.Steps {
				fmt.Fprintf(c.App.Writer, "%s: %s\n", s.Step, s.line())
			}
			return nil
		},
	}
}

// pipelineControlJSON is the answer of pipeline stop, pause and resume: one
// entry per step acted on.
type pipelineControlJSON struct {
	Pipeline int64                     `json:"pipeline"`
	Steps    []pipelineStepControlJSON `json:"steps"`
}

type pipelineStepControlJSON struct {
	Step string `json:"step"`
	controlJSON
}

func pipelineSubmitCommand() *cli.Command {
	return &cli.Command{
		Name:      "submit",
		Usage:     "submit a pipeline from a JSON file (- for standard input; the format is in docs/pipelines.md); prints its id",
		ArgsUsage: "FILE.json",
		Flags: commonFlags(
			&cli.BoolFlag{Name: "allow-unowned", Usage: "accept a pipeline whose bucket no live node holds"},
			&cli.BoolFlag{Name: "allow-unknown-kind", Usage: "accept steps whose kind the bucket's holder does not run"},
			jsonFlag,
		),
		Action: func(c *cli.Context) error {
			args, err := positional(c)
			if err != nil {
				return err
			}
			if len(args) != 1 {
				return invalid(fmt.Errorf("pipeline submit takes one file, got %d arguments", len(args)))
			}
			in := c.App.Reader
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return invalid(fmt.Errorf("read pipeline file: %w", err))
				}
				defer f.Close()
				in = f
			}
			req, err := parsePipeline(in, args[0])
			if err != nil {
				return invalid(err)
			}
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			var opts []flotilla.SubmitOption
			if c.Bool("allow-unowned") {
				opts = append(opts, flotilla.AllowUnowned())
			}
			if c.Bool("allow-unknown-kind") {
				opts = append(opts, flotilla.AllowUnknownKind())
			}
			p, err := client.SubmitPipeline(c.Context, req, opts...)
			if err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, newPipelineJSON(p))
			}
			fmt.Fprintln(c.App.Writer, p.ID)
			return nil
		},
	}
}

func pipelineGetCommand() *cli.Command {
	return &cli.Command{
		Name:      "get",
		Usage:     "show a pipeline as a tree, with each step's state, attempts and duration",
		ArgsUsage: "ID",
		Flags:     commonFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			id, err := pipelineID(c)
			if err != nil {
				return err
			}
			client, done, err := connectRead(c)
			if err != nil {
				return err
			}
			defer done()
			p, err := client.GetPipeline(c.Context, id)
			if err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, newPipelineJSON(p))
			}
			printPipeline(c.App.Writer, p)
			return nil
		},
	}
}

func pipelineRetryCommand() *cli.Command {
	return &cli.Command{
		Name:      "retry",
		Usage:     "run a step that did not succeed again, with its descendants that did not succeed, and nothing else",
		ArgsUsage: "ID --from NAME",
		Flags: commonFlags(
			&cli.StringFlag{Name: "from", Usage: "the step to run again (required)"},
			jsonFlag,
		),
		Action: func(c *cli.Context) error {
			id, err := pipelineID(c)
			if err != nil {
				return err
			}
			from := c.String("from")
			if from == "" {
				return invalid(errors.New("pipeline retry needs --from NAME, the step to run again"))
			}
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			p, err := client.RetryPipeline(c.Context, id, from)
			switch {
			case errors.Is(err, store.ErrConflict):
				return refused(err)
			case err != nil:
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, newPipelineJSON(p))
			}
			printPipeline(c.App.Writer, p)
			return nil
		},
	}
}

func pipelineID(c *cli.Context) (int64, error) {
	args, err := positional(c)
	if err != nil {
		return 0, err
	}
	if len(args) != 1 {
		return 0, invalid(fmt.Errorf("%s takes one pipeline ID, got %d arguments", c.Command.FullName(), len(args)))
	}
	id, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || id <= 0 {
		return 0, invalid(fmt.Errorf("pipeline ID %q is not a positive integer", args[0]))
	}
	return id, nil
}

type pipelineJSON struct {
	ID        int64              `json:"id"`
	Name      string             `json:"name"`
	Key       string             `json:"key"`
	Bucket    int                `json:"bucket"`
	Status    string             `json:"status"`
	CreatedAt any                `json:"created_at"`
	Tasks     []pipelineStepJSON `json:"tasks"`
}

type pipelineStepJSON struct {
	Name       string            `json:"name"`
	TaskID     int64             `json:"task_id"`
	Kind       string            `json:"kind"`
	Status     task.Status       `json:"status"`
	Attempt    int               `json:"attempt"`
	Tries      int               `json:"tries"`
	DependsOn  []task.Dependency `json:"depends_on"`
	Error      string            `json:"error,omitempty"`
	Result     json.RawMessage   `json:"result,omitempty"`
	StartedAt  any               `json:"started_at"`
	FinishedAt any               `json:"finished_at"`
}

func newPipelineJSON(p store.Pipeline) pipelineJSON {
	out := pipelineJSON{ID: p.ID, Name: p.Name, Key: p.Key, Bucket: p.Bucket, Status: p.Status(),
		CreatedAt: jsonTime(p.CreatedAt), Tasks: []pipelineStepJSON{}}
	for _, s := range p.Steps {
		deps := s.DependsOn
		if deps == nil {
			deps = []task.Dependency{}
		}
		out.Tasks = append(out.Tasks, pipelineStepJSON{
			Name: s.Name, TaskID: s.Task.ID, Kind: s.Task.Kind, Status: s.Task.Status, Attempt: s.Task.Attempt,
			Tries: s.Tries, DependsOn: deps, Error: s.Task.Error, Result: s.Task.Result,
			StartedAt: jsonTime(s.Task.StartedAt), FinishedAt: jsonTime(s.Task.FinishedAt),
		})
	}
	return out
}

// printPipeline draws the pipeline as a tree: each step under the steps it
// depends on. A step with several dependencies is drawn in full under the
// first and named again, with "(see above)", under the others. Below
// maxTreeDepth levels the indent stops growing and each step names the one
// it is drawn under ("after NAME"), so that the output grows with the
// pipeline, not with the square of a chain's length.
func printPipeline(w io.Writer, p store.Pipeline) {
	fmt.Fprintf(w, "pipeline %d %s  key %s  bucket %d  %s\n", p.ID, p.Name, p.Key, p.Bucket, p.Status())
	steps := make(map[string]store.PipelineStep, len(p.Steps))
	children := map[string][]string{}
	var roots []string
	for _, s := range p.Steps {
		steps[s.Name] = s
		if len(s.DependsOn) == 0 {
			roots = append(roots, s.Name)
		}
		for _, d := range s.DependsOn {
			children[d.Step] = append(children[d.Step], s.Name)
		}
	}
	drawn := map[string]bool{}
	var draw func(name, parent, indent string, depth int, last bool, edge string)
	draw = func(name, parent, indent string, depth int, last bool, edge string) {
		branch, next := "├─ ", "│  "
		if last {
			branch, next = "└─ ", "   "
		}
		if depth > maxTreeDepth {
			edge = "after " + parent + " " + edge
		}
		if drawn[name] {
			fmt.Fprintf(w, "%s%s%s%s (see above)\n", indent, branch, edge, name)
			return
		}
		drawn[name] = true
		fmt.Fprintf(w, "%s%s%s%s\n", indent, branch, edge, stepLine(steps[name]))
		if depth < maxTreeDepth {
			indent += next
		}
		kids := children[name]
		for i, k := range kids {
			on := ""
			for _, d := range steps[k].DependsOn {
				if d.Step == name && d.Policy() != task.OnSuccess {
					on = "[on " + d.Policy() + "] "
				}
			}
			draw(k, name, indent, depth+1, i == len(kids)-1, on)
		}
	}
	for i, r := range roots {
		draw(r, "", "", 1, i == len(roots)-1, "")
	}
}

// maxTreeDepth is how many levels of the pipeline tree are drawn indented.
const maxTreeDepth = 20

func stepLine(s store.PipelineStep) string {
	t := s.Task
	line := fmt.Sprintf("%s  %s  task %d  attempts %d", s.Name, t.Status, t.ID, t.Attempt)
	if !t.StartedAt.IsZero() {
		end := t.FinishedAt
		if end.IsZero() {
			end = t.UpdatedAt
		}
		line += "  " + end.Sub(t.StartedAt).Round(time.Millisecond).String()
	}
	if s.Tries > 1 {
		line += fmt.Sprintf("  (try %d)", s.Tries)
	}
	if t.Error != "" {
		line += "  error: " + firstLine(t.Error)
	}
	return line
}
