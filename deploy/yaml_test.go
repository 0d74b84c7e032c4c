package deploy

// The deployment files are read with go.yaml.in/yaml/v3 into plain values
// the checks walk: map[string]any, []any, string (every scalar, as written;
// the checks convert) or nil (a key with no value, null).

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// parseYAMLDocs parses every "---"-separated document of src.
func parseYAMLDocs(src string) ([]any, error) {
	dec := yaml.NewDecoder(strings.NewReader(src))
	var docs []any
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		v, err := plain(&n)
		if err != nil {
			return nil, err
		}
		if v != nil {
			docs = append(docs, v)
		}
	}
}

// parseYAML parses src, which must hold one document.
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

// plain turns a node into the values the checks walk.
func plain(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return plain(n.Content[0])
	case yaml.AliasNode:
		return plain(n.Alias)
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return nil, nil
		}
		return n.Value, nil
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := plain(c)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case yaml.MappingNode:
		out := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: a mapping key must be a scalar", k.Line)
			}
			if k.Value == "<<" { // a merge key: the aliased mapping's entries
				m, err := plain(v)
				if err != nil {
					return nil, err
				}
				mm, _ := m.(map[string]any)
				for mk, mv := range mm {
					if _, set := out[mk]; !set {
						out[mk] = mv
					}
				}
				continue
			}
			if _, dup := out[k.Value]; dup {
				return nil, fmt.Errorf("line %d: key %q twice", k.Line, k.Value)
			}
			pv, err := plain(v)
			if err != nil {
				return nil, err
			}
			out[k.Value] = pv
		}
		return out, nil
	}
	return nil, fmt.Errorf("line %d: unexpected YAML node kind %d", n.Line, n.Kind)
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
