package controller

import "thermite/internal/apiwire"

// The harness API's wire types and problem codes live in internal/apiwire,
// which the worker's client imports without the daemon; these names keep
// the controller's code and its callers as they were.
type (
	TrialInfo    = apiwire.TrialInfo
	ExecRequest  = apiwire.ExecRequest
	ExecFrame    = apiwire.ExecFrame
	outputFrame  = apiwire.OutputFrame
	StepRequest  = apiwire.StepRequest
	StepResult   = apiwire.StepResult
	NoteRequest  = apiwire.NoteRequest
	NoteResult   = apiwire.NoteResult
	FetchRequest = apiwire.FetchRequest
	FetchResult  = apiwire.FetchResult
	Problem      = apiwire.Problem
)

const (
	problemType = apiwire.ProblemType
	ToolHeader  = apiwire.ToolHeader
)

const (
	CodeBadJSON          = apiwire.CodeBadJSON
	CodeUnknownField     = apiwire.CodeUnknownField
	CodeBadField         = apiwire.CodeBadField
	CodeMissingField     = apiwire.CodeMissingField
	CodeUnauthorized     = apiwire.CodeUnauthorized
	CodeForbidden        = apiwire.CodeForbidden
	CodeDecoySeen        = apiwire.CodeDecoySeen
	CodeNoRoute          = apiwire.CodeNoRoute
	CodeMethodNotAllowed = apiwire.CodeMethodNotAllowed
	CodeBodyTimeout      = apiwire.CodeBodyTimeout
	CodeConflict         = apiwire.CodeConflict
	CodeTooLarge         = apiwire.CodeTooLarge
	CodeUnprocessable    = apiwire.CodeUnprocessable
	CodeTooManyRequests  = apiwire.CodeTooManyRequests
	CodeBusy             = apiwire.CodeBusy
	CodeInternal         = apiwire.CodeInternal
	CodeBadGateway       = apiwire.CodeBadGateway
	CodeTimeout          = apiwire.CodeTimeout
	CodeFetchRefused     = apiwire.CodeFetchRefused
)
