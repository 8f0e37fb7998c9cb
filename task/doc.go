// Package task holds flotilla's domain types: a Task, its fifteen states, the
// table of transitions between them, and the audit Event written for every
// transition. It does no I/O; stores and nodes enforce the table.
//
// The states and their meaning are in DESIGN §4. The table is data
// (transitions) so that the store, the node and the tests all read the same
// source, and a test checks every (from, to) pair against it.
package task
