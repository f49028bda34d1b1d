package kit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
)

// MaxCheckOutput bounds the check's stdout that ParseCheck accepts.
const MaxCheckOutput = 16 << 20

// CheckResult is the check's output, as the contract has it: the
// aggregate named by check.public and every case's result.
type CheckResult struct {
	Score float64
	Cases map[string]json.RawMessage
}

// PublicResult is the part of a check's output that may be shown: the
// aggregate and the cases that are not hidden.
type PublicResult struct {
	// Name is the aggregate's name (check.public).
	Name  string
	Score float64
	// Cases are the results of the cases that check.hidden does not name.
	Cases map[string]json.RawMessage
}

// MarshalJSON writes the result in the check's own shape, hidden cases
// left out: {"<public>": <score>, "cases": {...}}.
func (p PublicResult) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	name, _ := json.Marshal(p.Name)
	b.WriteByte('{')
	b.Write(name)
	b.WriteByte(':')
	b.WriteString(strconv.FormatFloat(p.Score, 'g', -1, 64))
	b.WriteString(`,"cases":{`)
	keys := make([]string, 0, len(p.Cases))
	for c := range p.Cases {
		keys = append(keys, c)
	}
	sort.Strings(keys)
	for i, c := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		cn, _ := json.Marshal(c)
		b.Write(cn)
		b.WriteByte(':')
		if err := json.Compact(&b, p.Cases[c]); err != nil {
			return nil, fmt.Errorf("case %q: %w", c, err)
		}
	}
	b.WriteString("}}")
	return b.Bytes(), nil
}

// DecodeCheck reads a check's output under the contract, with public as
// the aggregate's name. Errors describe what is wrong without quoting the
// output.
func DecodeCheck(out []byte, public string) (CheckResult, error) {
	var r CheckResult
	if len(out) > MaxCheckOutput {
		return r, fmt.Errorf("the output is larger than %d bytes", MaxCheckOutput)
	}
	trimmed := bytes.TrimSpace(out)
	if len(trimmed) == 0 {
		return r, errors.New("the check printed nothing (want one JSON object)")
	}
	if trimmed[0] != '{' {
		return r, errors.New("the output is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	var obj map[string]json.RawMessage
	if err := dec.Decode(&obj); err != nil {
		return r, fmt.Errorf("the output is not one JSON object (%s)", jsonProblem(err))
	}
	if dec.InputOffset() != int64(len(trimmed)) {
		return r, errors.New("the output holds more than one JSON object")
	}
	for m := range obj {
		if m != public && m != "cases" {
			return r, fmt.Errorf("member %q is neither %q nor \"cases\"", m, public)
		}
	}
	raw, ok := obj[public]
	if !ok {
		return r, fmt.Errorf("no %q member", public)
	}
	var score *float64
	if err := json.Unmarshal(raw, &score); err != nil || score == nil || math.IsInf(*score, 0) || math.IsNaN(*score) {
		return r, fmt.Errorf("%q is not a number", public)
	}
	r.Score = *score
	r.Cases = map[string]json.RawMessage{}
	if raw, ok := obj["cases"]; ok {
		if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
			return r, errors.New(`"cases" is not a JSON object`)
		}
		var cases map[string]json.RawMessage
		if err := json.Unmarshal(raw, &cases); err != nil {
			return r, fmt.Errorf(`"cases" is not a JSON object (%s)`, jsonProblem(err))
		}
		for c, v := range cases {
			if c == "" {
				return r, errors.New("a case has an empty name")
			}
			var b bytes.Buffer
			if err := json.Compact(&b, v); err != nil {
				return r, fmt.Errorf("case %q: %s", c, jsonProblem(err))
			}
			r.Cases[c] = b.Bytes()
		}
	}
	return r, nil
}

// jsonProblem says what encoding/json found wrong, without the value.
func jsonProblem(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("a JSON %s where an object was wanted", te.Value)
	}
	return "unexpected end or invalid JSON"
}

// ParseCheck reads the check's output for kit k and splits it: the cases
// that k's check.hidden names go only to hidden (case name -> result, for
// the ledger's hidden table); the aggregate and the other cases make up
// public. A hidden case the check did not report is simply absent. Output
// that breaks the contract is an error naming the kit and what is wrong,
// never quoting the output.
func ParseCheck(out []byte, k *Kit) (public PublicResult, hidden map[string]json.RawMessage, err error) {
	r, err := DecodeCheck(out, k.Check.Public)
	if err != nil {
		return PublicResult{}, nil, fmt.Errorf("check of kit %q: %w", k.Name, err)
	}
	public = PublicResult{Name: k.Check.Public, Score: r.Score, Cases: map[string]json.RawMessage{}}
	hidden = map[string]json.RawMessage{}
	for c, v := range r.Cases {
		if k.IsHidden(c) {
			hidden[c] = v
		} else {
			public.Cases[c] = v
		}
	}
	return public, hidden, nil
}
