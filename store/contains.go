package store

import (
	"encoding/json"
	"fmt"
)

// ParsePayloadFilter reads TaskFilter.Payload for PayloadContains; nil when
// the filter has none. A filter that is not JSON is refused with ErrInvalid,
// naming it.
func ParsePayloadFilter(f json.RawMessage) (any, error) {
	if f == nil {
		return nil, nil
	}
	var want any
	if err := json.Unmarshal(f, &want); err != nil {
		return nil, fmt.Errorf("list tasks: payload filter %s is not valid JSON; give a JSON value such as {\"customer\": 7}: %w", f, ErrInvalid)
	}
	return want, nil
}

// PayloadContains is PostgreSQL's jsonb @> on a stored payload, for the
// stores that decide TaskFilter.Payload in Go: want is what
// ParsePayloadFilter returned.
func PayloadContains(payload json.RawMessage, want any) bool {
	var have any
	if len(payload) == 0 {
		payload = json.RawMessage("null")
	}
	if err := json.Unmarshal(payload, &have); err != nil {
		return false
	}
	return jsonContains(have, want, true)
}

// jsonContains follows jsonb containment: an object contains another when
// it has each of its members with a value that contains the other's; an
// array contains another when each of its elements is contained in some
// element; scalars contain what equals them. At the top level only, an
// array also contains a scalar that is one of its elements.
func jsonContains(have, want any, top bool) bool {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return false
		}
		for k, wv := range w {
			hv, ok := h[k]
			if !ok || !jsonContains(hv, wv, false) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok {
			return false
		}
		for _, wv := range w {
			found := false
			for _, hv := range h {
				if jsonContains(hv, wv, false) {
					found = true
					break
				}
			}
			if !found {
				return false
			}
		}
		return true
	default:
		if h, ok := have.([]any); ok && top {
			for _, hv := range h {
				if hv == want {
					return true
				}
			}
			return false
		}
		return have == want
	}
}
