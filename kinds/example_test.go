package kinds_test

import (
	"fmt"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/kinds"
)

// The stock kinds' payloads are task types like any other: SubmitArgs
// submits them.
func ExampleSleepPayload_Kind() {
	r, err := flotilla.NewRequest(kinds.SleepPayload{Duration: "2s"}, flotilla.WithKey("order-1"))
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Kind, string(r.Payload))
	// Output:
	// sleep {"duration":"2s"}
}

// A fail task fails until the attempt it names.
func ExampleFailPayload_Kind() {
	r, err := flotilla.NewRequest(kinds.FailPayload{UntilAttempt: 2})
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Kind, string(r.Payload))
	// Output:
	// fail {"until_attempt":2}
}

// An exec task runs a child process, if the node allows its executable.
func ExampleExecPayload_Kind() {
	r, err := flotilla.NewRequest(kinds.ExecPayload{Argv: []string{"/bin/echo", "hi"}})
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Kind, string(r.Payload))
	// Output:
	// exec {"argv":["/bin/echo","hi"]}
}
