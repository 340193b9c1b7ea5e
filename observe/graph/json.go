package graph

import (
	"encoding/json"
	"io"
)

// WriteJSON writes g as indented JSON, the form scripts read.
func WriteJSON(w io.Writer, g Graph) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(g)
}
