package dashboard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// DefaultSecretFields name the payload and result fields whose values the
// pages mask unless the operator asks to reveal them. A field is masked
// when its name, folded (lower case, without '-', '_', '.' or spaces),
// contains one of them: "X-Api-Key", "api_key" and "stripeApiKey" all
// contain "apikey".
var DefaultSecretFields = []string{
	"password", "passwd", "passphrase", "secret", "token", "authorization", "apikey", "privatekey",
	"accesskey", "credential", "cookie", "dsn",
}

// masked replaces a secret's value on the page.
const masked = "•••• masked"

// masker masks the values of secret-like fields in JSON documents.
type masker struct {
	names []string
}

func newMasker(extra []string) (*masker, error) {
	m := &masker{}
	for _, n := range append(append([]string{}, DefaultSecretFields...), extra...) {
		f := fold(n)
		if f == "" {
			return nil, fmt.Errorf("secret field %q is empty once folded: give a name such as \"pin\"", n)
		}
		m.names = append(m.names, f)
	}
	return m, nil
}

func fold(name string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '-', '_', '.', ' ':
			return -1
		}
		return r
	}, strings.ToLower(name))
}

func (m *masker) secret(name string) bool {
	f := fold(name)
	for _, n := range m.names {
		if strings.Contains(f, n) {
			return true
		}
	}
	return false
}

// jsonNode is a JSON value that keeps the order of an object's members.
type jsonNode struct {
	obj    []jsonMember
	arr    []*jsonNode
	isObj  bool
	isArr  bool
	scalar json.RawMessage
}

type jsonMember struct {
	key   string
	value *jsonNode
}

func parseJSON(dec *json.Decoder) (*jsonNode, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		n := &jsonNode{}
		switch t {
		case '{':
			n.isObj = true
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := parseJSON(dec)
				if err != nil {
					return nil, err
				}
				n.obj = append(n.obj, jsonMember{key: k.(string), value: v})
			}
		case '[':
			n.isArr = true
			for dec.More() {
				v, err := parseJSON(dec)
				if err != nil {
					return nil, err
				}
				n.arr = append(n.arr, v)
			}
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		return n, nil
	case string:
		return &jsonNode{scalar: jsonText(t)}, nil
	default:
		raw, err := json.Marshal(t)
		return &jsonNode{scalar: raw}, err
	}
}

// jsonText encodes a string as JSON for display: html/template escapes
// the page, so '<' stays '<' here rather than becoming \u003c.
func jsonText(s string) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

var maskedJSON = jsonText(masked)

func maskedNode() *jsonNode { return &jsonNode{scalar: maskedJSON} }

func (n *jsonNode) isMasked() bool { return bytes.Equal(n.scalar, maskedJSON) }

// mask replaces the values of secret-like members, at any depth; it
// returns how many it replaced.
func (m *masker) mask(n *jsonNode) int {
	count := 0
	for i := range n.obj {
		if m.secret(n.obj[i].key) {
			if n.obj[i].value.isMasked() {
				continue
			}
			n.obj[i].value = maskedNode()
			count++
			continue
		}
		count += m.mask(n.obj[i].value)
	}
	for _, v := range n.arr {
		count += m.mask(v)
	}
	return count
}

// maskExec masks what the exec kind itself keeps from everyone but the
// child: every value of the payload's env, and in argv the value of a
// secret-like option ("--token=x", or "--token" "x").
func (m *masker) maskExec(n *jsonNode) int {
	count := 0
	for i, member := range n.obj {
		switch {
		case member.key == "env" && member.value.isObj:
			for j := range member.value.obj {
				member.value.obj[j].value = maskedNode()
				count++
			}
		case member.key == "argv" && member.value.isArr:
			count += m.maskArgv(member.value.arr)
		default:
			continue
		}
		n.obj[i] = member
	}
	return count
}

func (m *masker) maskArgv(argv []*jsonNode) int {
	count := 0
	nextIsSecret := false
	for i, a := range argv {
		var s string
		if json.Unmarshal(a.scalar, &s) != nil {
			nextIsSecret = false
			continue
		}
		if nextIsSecret && !strings.HasPrefix(s, "-") {
			argv[i] = maskedNode()
			count++
			nextIsSecret = false
			continue
		}
		nextIsSecret = false
		name, _, hasValue := strings.Cut(strings.TrimLeft(s, "-"), "=")
		switch {
		case !m.secret(name):
		case hasValue:
			argv[i] = &jsonNode{scalar: jsonText(s[:strings.Index(s, "=")+1] + masked)}
			count++
		case strings.HasPrefix(s, "-"):
			nextIsSecret = true
		}
	}
	return count
}

func (n *jsonNode) write(b *bytes.Buffer, indent string) {
	switch {
	case n.isObj:
		if len(n.obj) == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteString("{\n")
		for i, m := range n.obj {
			b.WriteString(indent + "  ")
			b.Write(jsonText(m.key))
			b.WriteString(": ")
			m.value.write(b, indent+"  ")
			if i < len(n.obj)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(indent + "}")
	case n.isArr:
		if len(n.arr) == 0 {
			b.WriteString("[]")
			return
		}
		b.WriteString("[\n")
		for i, v := range n.arr {
			b.WriteString(indent + "  ")
			v.write(b, indent+"  ")
			if i < len(n.arr)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(indent + "]")
	default:
		b.Write(n.scalar)
	}
}

// shown is a JSON document as a page shows it: indented, its secrets
// masked unless revealed.
type shown struct {
	Text   string
	Masked int // values masked
}

// show indents a document and, unless reveal, masks its secrets; an exec
// payload also has its env values and secret options masked.
func (m *masker) show(raw json.RawMessage, execPayload, reveal bool) shown {
	if len(raw) == 0 {
		return shown{}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	n, err := parseJSON(dec)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			err = fmt.Errorf("more than one JSON value")
		}
	}
	if err != nil {
		// Stores keep valid JSON only; should one not be, it is shown as
		// text, and masked whole: nothing can tell its secrets apart.
		if reveal {
			return shown{Text: string(raw)}
		}
		return shown{Text: masked, Masked: 1}
	}
	count := 0
	if !reveal {
		if execPayload {
			count = m.maskExec(n)
		}
		count += m.mask(n)
	}
	var b bytes.Buffer
	n.write(&b, "")
	return shown{Text: b.String(), Masked: count}
}
