package main

import (
	"os"

	"github.com/spf13/cobra"

	"thermite/controller"
)

// openapiCmd prints the harness API's OpenAPI document, the same bytes
// GET /v1/openapi.json answers: `thermite openapi > docs/openapi.json`.
func openapiCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "openapi",
		Short: "Print the harness API's OpenAPI 3.1 document (docs/openapi.json)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := os.Stdout.Write(controller.OpenAPIJSON())
			return err
		},
	}
}
