// Package task holds flotilla's domain types: a Task, its fifteen states, the
// table of transitions between them, and the audit Event written for every
// transition. It does no I/O; stores and nodes enforce the table.
//
// A program meets it where a task comes back: what Client.Get, List and
// Wait return is a *Task, whose Status says where it is, and whose result
// flotilla.ResultOf decodes.
//
//	t, err := client.Wait(ctx, id)
//	switch {
//	case t.Status == task.Succeeded:
//		thumb, err := flotilla.ResultOf[Thumbnail](t)
//	case t.Status.Terminal():
//		log.Printf("task %d ended %s: %s", t.ID, t.Status, t.Error)
//	}
//
// A handler returns ErrPaused at a checkpoint, and wraps in NoRetry an error
// another attempt cannot fix; pipeline steps are Steps with Dependencies.
//
// The states and their meaning are in DESIGN §4. The table is data
// (transitions) so that the store, the node and the tests all read the same
// source, and a test checks every (from, to) pair against it.
package task
