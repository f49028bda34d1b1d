// Package selftest is the isolation self-test: the table of probes, the
// probe that runs as each role, and the verdict sentence.
package selftest
