package outbox

import "github.com/ThreeDotsLabs/watermill/message"

// RecordHandlerError is a Watermill handler middleware that keeps a failed
// handler's error text on the message, so the Subscriber stores it (sanitised
// and cut to MaxErrorBytes) as the event's last error when the router Nacks.
func RecordHandlerError(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil {
			msg.Metadata.Set(MetadataHandlerError, err.Error())
		}
		return out, err
	}
}
