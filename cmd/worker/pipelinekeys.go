package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// maxPipelineFileBytes bounds what `worker pipeline submit` reads: room
// for a pipeline of many steps with payloads, and a clear refusal rather
// than a process that reads whatever it is given into memory.
const maxPipelineFileBytes = 64 << 20

// pipelineFileKeys and pipelineTaskKeys are the keys a pipeline file's
// object and each of its tasks may have, spelled exactly so.
var (
	pipelineFileKeys = []string{"name", "key", "tasks"}
	pipelineTaskKeys = []string{"name", "kind", "payload", "priority", "max_attempts", "timeout", "depends_on", "on"}
)

// checkPipelineKeys refuses what encoding/json would accept silently in a
// pipeline file: a key given twice (the second would erase the first: a
// second "depends_on" would start a step at once), a key spelled in
// another case ("Depends_On" is read as "depends_on"), and unknown keys.
// A payload is the handler's document and is not looked into.
func checkPipelineKeys(data []byte) error {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	return walkObject(dec, "the pipeline", pipelineFileKeys, func(key, where string) error {
		if key != "tasks" {
			return skipValue(dec)
		}
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if tok == nil { // "tasks": null
			return nil
		}
		if d, ok := tok.(json.Delim); !ok || d != '[' {
			return fmt.Errorf(`"tasks" is not a list of tasks`)
		}
		for i := 0; dec.More(); i++ {
			err := walkObject(dec, fmt.Sprintf("task %d", i), pipelineTaskKeys, func(string, string) error {
				return skipValue(dec)
			})
			if err != nil {
				return err
			}
		}
		_, err = dec.Token() // ]
		return err
	})
}

// walkObject reads one JSON object from dec, refusing keys that are not
// among allowed (exactly) or that come twice, and calls value for each key
// to read its value.
func walkObject(dec *json.Decoder, where string, allowed []string, value func(key, where string) error) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("%s is not a JSON object", where)
	}
	seen := map[string]string{} // lower-cased key -> the key as first given
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		folded := strings.ToLower(key)
		if first, dup := seen[folded]; dup {
			if first == key {
				return fmt.Errorf("%s has the key %q twice: give each key once", where, key)
			}
			return fmt.Errorf("%s has the keys %q and %q, which are read as one: give each key once", where, first, key)
		}
		seen[folded] = key
		if !slices.Contains(allowed, key) {
			for _, a := range allowed {
				if strings.EqualFold(a, key) {
					return fmt.Errorf("%s has the key %q: keys are lower case, write %q", where, key, a)
				}
			}
			return fmt.Errorf("%s has the unknown key %q: valid keys are %s", where, key, strings.Join(allowed, ", "))
		}
		if err := value(key, where); err != nil {
			return err
		}
	}
	_, err = dec.Token() // }
	return err
}

// skipValue reads one JSON value from dec and drops it.
func skipValue(dec *json.Decoder) error {
	var v json.RawMessage
	return dec.Decode(&v)
}

// readPipelineFile reads a pipeline file, refusing one over
// maxPipelineFileBytes.
func readPipelineFile(r io.Reader, source string) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r, maxPipelineFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxPipelineFileBytes {
		return nil, fmt.Errorf("%s: the pipeline file is over %d MiB, the most pipeline submit reads", source, maxPipelineFileBytes>>20)
	}
	return body, nil
}
