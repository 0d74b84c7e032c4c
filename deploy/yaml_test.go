package deploy

// A parser for the small block-style YAML subset the deployment files are
// written in, so that the test needs no YAML module. It is strict: what it
// does not understand (anchors, tags, multi-line strings, flow mappings
// other than {}) is an error, never a silent misreading.
//
// Values are map[string]any, []any, string (every scalar; the checks
// convert) or nil (a key with no value).

import (
	"fmt"
	"strconv"
	"strings"
)

type yamlLine struct {
	num    int // 1-based line number in the source
	indent int
	text   string // without indentation and comment
}

// parseYAMLDocs parses every "---"-separated document of src.
func parseYAMLDocs(src string) ([]any, error) {
	var docs []any
	var cur []yamlLine
	flush := func() error {
		if len(cur) == 0 {
			return nil
		}
		p := &yamlParser{lines: cur}
		v, err := p.node()
		if err != nil {
			return err
		}
		if p.i < len(p.lines) {
			return p.errf("unexpected content")
		}
		docs = append(docs, v)
		cur = nil
		return nil
	}
	for n, raw := range strings.Split(src, "\n") {
		raw = strings.TrimRight(raw, "\r")
		body := strings.TrimLeft(raw, " ")
		if strings.HasPrefix(body, "\t") {
			return nil, fmt.Errorf("line %d: tab in indentation", n+1)
		}
		text, err := stripComment(body)
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", n+1, err)
		}
		if text == "" {
			continue
		}
		if text == "---" && len(body) == len(raw) {
			if err := flush(); err != nil {
				return nil, err
			}
			continue
		}
		cur = append(cur, yamlLine{num: n + 1, indent: len(raw) - len(body), text: text})
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return docs, nil
}

// parseYAML parses a single-document file.
func parseYAML(src string) (any, error) {
	docs, err := parseYAMLDocs(src)
	if err != nil {
		return nil, err
	}
	if len(docs) != 1 {
		return nil, fmt.Errorf("want one YAML document, got %d", len(docs))
	}
	return docs[0], nil
}

// stripComment cuts a "#" comment that is outside quotes and starts the line
// or follows a space, and trims trailing spaces.
func stripComment(s string) (string, error) {
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == '"':
			if c == '\\' {
				i++
			} else if c == '"' {
				quote = 0
			}
		case quote == '\'':
			if c == '\'' {
				if i+1 < len(s) && s[i+1] == '\'' {
					i++
				} else {
					quote = 0
				}
			}
		case c == '#' && (i == 0 || s[i-1] == ' '):
			return strings.TrimRight(s[:i], " "), nil
		case (c == '"' || c == '\'') && (i == 0 || strings.IndexByte(" [,", s[i-1]) >= 0):
			quote = c
		}
	}
	if quote != 0 {
		return "", fmt.Errorf("unterminated %c-quoted string", quote)
	}
	return strings.TrimRight(s, " "), nil
}

type yamlParser struct {
	lines []yamlLine
	i     int
}

func (p *yamlParser) errf(format string, args ...any) error {
	n := 0
	if p.i < len(p.lines) {
		n = p.lines[p.i].num
	} else if len(p.lines) > 0 {
		n = p.lines[len(p.lines)-1].num
	}
	return fmt.Errorf("line %d: %s", n, fmt.Sprintf(format, args...))
}

func isSeqItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

// node parses the block that starts at the current line.
func (p *yamlParser) node() (any, error) {
	l := p.lines[p.i]
	if isSeqItem(l.text) {
		return p.seq(l.indent)
	}
	return p.mapping(l.indent)
}

func (p *yamlParser) seq(indent int) (any, error) {
	out := []any{}
	for p.i < len(p.lines) && p.lines[p.i].indent == indent && isSeqItem(p.lines[p.i].text) {
		l := p.lines[p.i]
		rest := strings.TrimLeft(l.text[1:], " ")
		switch {
		case rest == "":
			p.i++
			if p.i < len(p.lines) && p.lines[p.i].indent > indent {
				v, err := p.node()
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			} else {
				out = append(out, nil)
			}
		case isSeqItem(rest):
			return nil, p.errf("nested sequence on one line is not supported")
		case isMapEntry(rest):
			// "- key: value": a mapping whose keys align with "key".
			col := indent + len(l.text) - len(rest)
			p.lines[p.i] = yamlLine{num: l.num, indent: col, text: rest}
			v, err := p.mapping(col)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		default:
			v, err := parseScalar(rest)
			if err != nil {
				return nil, p.errf("%v", err)
			}
			p.i++
			out = append(out, v)
		}
	}
	if p.i < len(p.lines) && p.lines[p.i].indent > indent {
		return nil, p.errf("unexpected indentation")
	}
	return out, nil
}

func (p *yamlParser) mapping(indent int) (any, error) {
	m := map[string]any{}
	for p.i < len(p.lines) && p.lines[p.i].indent == indent {
		l := p.lines[p.i]
		if isSeqItem(l.text) {
			return nil, p.errf("sequence item where a key was expected")
		}
		key, val, ok, err := splitKey(l.text)
		if err != nil {
			return nil, p.errf("%v", err)
		}
		if !ok {
			return nil, p.errf("expected \"key: value\", got %q", l.text)
		}
		if _, dup := m[key]; dup {
			return nil, p.errf("duplicate key %q", key)
		}
		p.i++
		if val == "" {
			switch {
			case p.i < len(p.lines) && p.lines[p.i].indent > indent:
				v, err := p.node()
				if err != nil {
					return nil, err
				}
				m[key] = v
			case p.i < len(p.lines) && p.lines[p.i].indent == indent && isSeqItem(p.lines[p.i].text):
				// "key:" followed by "- item" at the key's own indentation.
				v, err := p.seq(indent)
				if err != nil {
					return nil, err
				}
				m[key] = v
			default:
				m[key] = nil
			}
			continue
		}
		v, err := parseScalar(val)
		if err != nil {
			return nil, p.errf("%s: %v", key, err)
		}
		m[key] = v
		if p.i < len(p.lines) && p.lines[p.i].indent > indent {
			return nil, p.errf("unexpected indentation after %q (multi-line values are not supported)", key)
		}
	}
	if p.i < len(p.lines) && p.lines[p.i].indent > indent {
		return nil, p.errf("unexpected indentation")
	}
	return m, nil
}

// isMapEntry reports whether a sequence item's text starts a mapping.
func isMapEntry(text string) bool {
	_, _, ok, err := splitKey(text)
	return ok && err == nil
}

// splitKey splits "key: value" or "key:"; ok is false when text is not a
// mapping entry (a plain or quoted scalar).
func splitKey(text string) (key, val string, ok bool, err error) {
	if text[0] == '"' || text[0] == '\'' {
		end := closingQuote(text)
		if end < 0 {
			return "", "", false, fmt.Errorf("unterminated quoted key")
		}
		rest := text[end+1:]
		if rest != ":" && !strings.HasPrefix(rest, ": ") {
			return "", "", false, nil
		}
		k, err := parseScalar(text[:end+1])
		if err != nil {
			return "", "", false, err
		}
		return k.(string), strings.TrimSpace(rest[1:]), true, nil
	}
	if text[0] == '[' || text[0] == '{' {
		return "", "", false, nil
	}
	if i := strings.Index(text, ": "); i >= 0 {
		return text[:i], strings.TrimSpace(text[i+2:]), true, nil
	}
	if strings.HasSuffix(text, ":") {
		return text[:len(text)-1], "", true, nil
	}
	return "", "", false, nil
}

// closingQuote returns the index of the quote that closes the string s
// starts with, or -1.
func closingQuote(s string) int {
	q := s[0]
	for i := 1; i < len(s); i++ {
		switch {
		case q == '"' && s[i] == '\\':
			i++
		case s[i] == q && q == '\'' && i+1 < len(s) && s[i+1] == '\'':
			i++
		case s[i] == q:
			return i
		}
	}
	return -1
}

func parseScalar(s string) (any, error) {
	switch s[0] {
	case '"', '\'':
		end := closingQuote(s)
		if end != len(s)-1 {
			return nil, fmt.Errorf("text after the closing quote in %s", s)
		}
		if s[0] == '\'' {
			return strings.ReplaceAll(s[1:end], "''", "'"), nil
		}
		v, err := strconv.Unquote(s)
		if err != nil {
			return nil, fmt.Errorf("bad double-quoted string %s: %v", s, err)
		}
		return v, nil
	case '[':
		if !strings.HasSuffix(s, "]") {
			return nil, fmt.Errorf("flow sequence must fit on one line: %s", s)
		}
		inner := strings.TrimSpace(s[1 : len(s)-1])
		out := []any{}
		if inner == "" {
			return out, nil
		}
		for _, item := range splitFlow(inner) {
			item = strings.TrimSpace(item)
			if item == "" || item[0] == '[' || item[0] == '{' {
				return nil, fmt.Errorf("only flat flow sequences of scalars are supported: %s", s)
			}
			v, err := parseScalar(item)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case '{':
		if s == "{}" {
			return map[string]any{}, nil
		}
		return nil, fmt.Errorf("flow mappings other than {} are not supported: %s", s)
	case '&', '*', '!', '|', '>', '%', '@', '`':
		return nil, fmt.Errorf("%q (anchor, alias, tag, block scalar or reserved) is not supported", s[0])
	}
	if strings.Contains(s, ": ") {
		return nil, fmt.Errorf("plain scalar %q contains \": \"; quote it", s)
	}
	return s, nil
}

// splitFlow splits a flow sequence's inside on commas outside quotes.
func splitFlow(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"', '\'':
			if end := closingQuote(s[i:]); end > 0 {
				i += end
			}
		case ',':
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// Accessors: nil when the path does not lead to a value of that type.

func dig(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func digMap(v any, path ...string) map[string]any {
	m, _ := dig(v, path...).(map[string]any)
	return m
}

func digList(v any, path ...string) []any {
	l, _ := dig(v, path...).([]any)
	return l
}

func digStr(v any, path ...string) string {
	s, _ := dig(v, path...).(string)
	return s
}

// strList turns a list of scalars (or one string, split on spaces) into
// strings.
func strList(v any) []string {
	switch v := v.(type) {
	case string:
		return strings.Fields(v)
	case []any:
		out := make([]string, 0, len(v))
		for _, x := range v {
			s, _ := x.(string)
			out = append(out, s)
		}
		return out
	}
	return nil
}
