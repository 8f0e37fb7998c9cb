package dashboard

import (
	"context"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/commands"
)

type commandsResult = commands.Result

// The task actions are package commands' requests, as `worker stop`,
// `worker pause` and `worker resume` make them: a task no node runs changes
// at once; a running one gets a command that its node acknowledges.
func (s *Server) stop(ctx context.Context, id int64, reason, by string) (commandsResult, error) {
	return commands.Stop(ctx, s.cfg.Store, id, reason, by)
}

func (s *Server) pause(ctx context.Context, id int64, reason, by string) (commandsResult, error) {
	return commands.Pause(ctx, s.cfg.Store, id, reason, by)
}

func (s *Server) resume(ctx context.Context, id int64, reason, by string) (commandsResult, error) {
	return commands.Resume(ctx, s.cfg.Store, id, reason, by)
}

func zapActor(s *session) zap.Field     { return zap.String("actor", s.Actor()) }
func zapTask(id int64) zap.Field        { return zap.Int64("task", id) }
func zapRetry(id int64) zap.Field       { return zap.Int64("retry", id) }
func zapPipeline(id int64) zap.Field    { return zap.Int64("pipeline", id) }
func zapStep(name string) zap.Field     { return zap.String("step", name) }
func zapSteps(n int) zap.Field          { return zap.Int("steps", n) }
func zapAction(a string) zap.Field      { return zap.String("action", a) }
func zapStatus(st string) zap.Field     { return zap.String("status", st) }
func zapSchedule(name string) zap.Field { return zap.String("schedule", name) }
