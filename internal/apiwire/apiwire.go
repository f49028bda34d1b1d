// Package apiwire is the harness API's wire: the JSON bodies its routes
// take and answer, and the codes of its problems. The controller serves
// them and the worker's client (internal/trialclient) sends and reads
// them; both import this package, so the client links none of the
// daemon (TestClientLinksNoDaemon). It imports nothing of thermite.
package apiwire

import "encoding/json"

// TrialInfo is what `thermite trial start` prints and what an agent's
// folder holds as trial.json.
type TrialInfo struct {
	ID          string `json:"id"`
	Run         string `json:"run"`
	Lane        int    `json:"lane"`
	Workspace   string `json:"workspace"`
	AgentDir    string `json:"agent_dir"`
	TokenFile   string `json:"token_file"`
	ResearchDir string `json:"research_dir"`
	LaneArea    string `json:"lane_area"`
	// APISocket is the one way a trial's processes reach the API: the
	// lane's and the agent's network policy (api) gives them no TCP. It is
	// the agent's own socket (the lane harness's details name the lane's).
	APISocket string `json:"api_socket"`
}

// ExecRequest runs one command in a trial.
type ExecRequest struct {
	Argv      []string `json:"argv"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	Env       []string `json:"env,omitempty"`
	// Cwd is a folder inside the workspace, relative to it ("" is the
	// workspace itself); an absolute path is accepted when it lies inside.
	Cwd string `json:"cwd,omitempty"`
	// Stdin is what the command reads on its standard input, as text;
	// StdinB64 the same for bytes that are not UTF-8. With neither, it
	// reads /dev/null.
	Stdin    string `json:"stdin,omitempty"`
	StdinB64 []byte `json:"stdin_b64,omitempty"`
}

// ExecFrame is one line of an exec's answer: output as it comes, then one
// frame with Done set that says how it ended. An output frame carries its
// bytes in Data when they are UTF-8 text and in DataB64 (base64) when
// they are not; a frame never ends inside a UTF-8 sequence. Only the last
// frame has an exit code.
type ExecFrame struct {
	Stream  string `json:"stream,omitempty"` // "stdout" or "stderr"
	Data    string `json:"data,omitempty"`
	DataB64 []byte `json:"data_b64,omitempty"`

	Done        bool   `json:"done,omitempty"`
	ExitCode    int    `json:"exit_code"`
	Signal      int    `json:"signal,omitempty"`
	Stopped     string `json:"stopped,omitempty"`
	WallMS      int64  `json:"wall_ms,omitempty"`
	OutputBytes int64  `json:"output_bytes,omitempty"`
	OutputCap   int64  `json:"output_cap,omitempty"`
	Truncated   bool   `json:"truncated,omitempty"`
	Error       string `json:"error,omitempty"`
}

// OutputFrame is what an output frame says: its stream and its bytes,
// and no exit code (the command has not ended). The API's description
// names it as the shape of every frame but the last.
type OutputFrame struct {
	Stream  string `json:"stream"`
	Data    string `json:"data,omitempty"`
	DataB64 []byte `json:"data_b64,omitempty"`
}

// MarshalJSON writes an output frame without the fields of the last one.
func (f ExecFrame) MarshalJSON() ([]byte, error) {
	if !f.Done {
		return json.Marshal(OutputFrame{Stream: f.Stream, Data: f.Data, DataB64: f.DataB64})
	}
	type last ExecFrame
	return json.Marshal(last(f))
}

// StepRequest records one step of the agent's work.
type StepRequest struct {
	Kind string `json:"kind"`
	Text string `json:"text"`
}

// StepResult says how many bytes of text a step recorded.
type StepResult struct {
	Recorded int `json:"recorded"`
}

// NoteRequest records a research note.
type NoteRequest struct {
	Title string `json:"title"`
	Body  string `json:"body"`
}

// NoteResult is where a note lies in the research folder, as POST
// /v1/research/read takes it.
type NoteResult struct {
	Path string `json:"path"`
}

// FetchRequest asks the controller to fetch a page for the run.
type FetchRequest struct {
	URL string `json:"url"`
}

// FetchResult is a fetched page's record; Path is where its body lies in
// the research folder, as POST /v1/research/read takes it.
type FetchResult struct {
	URL         string `json:"url"`
	Status      int    `json:"status"`
	ContentType string `json:"content_type"`
	Size        int    `json:"size"`
	Path        string `json:"path"`
}

// Problem is every error answer of the controller's APIs, an RFC 9457
// problem detail (application/problem+json): Code is the stable,
// machine-readable name of what went wrong, Detail the one line for a
// person, and Type the code as a URI (ProblemType + Code).
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// ToolHeader names the MCP tool a harness API call serves, as the trial
// client's MCP server sends it; the call's event records it. It is the
// agent's word only, which the controller keeps when it is a tool's name.
const ToolHeader = "Thermite-Tool"

// ProblemType is the URI prefix of a problem's type: one URI per code.
const ProblemType = "urn:thermite:problem:"

// The codes of problems the API answers besides those of the file helper
// (lanefs.Code*). A client may rely on them; they never change meaning.
const (
	CodeBadJSON          = "bad_json"           // the body is not the JSON the route takes
	CodeUnknownField     = "unknown_field"      // a field the route does not take
	CodeBadField         = "bad_field"          // a field of the wrong type or value
	CodeMissingField     = "missing_field"      // a field the route needs is absent
	CodeUnauthorized     = "unauthorized"       // no token, a wrong one, or an ended trial's
	CodeForbidden        = "forbidden"          // refused by policy
	CodeDecoySeen        = "decoy_seen"         // the request held the trial's decoy credential
	CodeNoRoute          = "no_route"           // no such path
	CodeMethodNotAllowed = "method_not_allowed" // the path takes other methods
	CodeBodyTimeout      = "body_timeout"       // the body did not arrive in time
	CodeConflict         = "conflict"
	CodeTooLarge         = "too_large" // a body, a record or a page over its limit
	CodeUnprocessable    = "unprocessable"
	CodeTooManyRequests  = "too_many_requests" // over the token's share
	CodeBusy             = "busy"              // over the whole API's share: try again
	CodeInternal         = "internal"
	CodeBadGateway       = "bad_gateway"   // the file helper or a fetched server failed
	CodeTimeout          = "timeout"       // a fetched server did not answer in time
	CodeFetchRefused     = "fetch_refused" // a fetch to a refused address or scheme
)
