package main

import "time"

// Stream is the outbox stream (Watermill topic) of every order event.
// Every event of an order carries the order id as its ordering key, so a
// consumer group gets an order's events one at a time, in commit order.
const Stream = "orders"

// Event kinds on Stream.
const (
	// KindOrderPlaced is published with each new order.
	KindOrderPlaced = "OrderPlaced"
	// KindOrderReserved is recorded when stock was reserved for an order.
	KindOrderReserved = "OrderReserved"
	// KindOrderRejected is recorded when an order could not be reserved.
	KindOrderRejected = "OrderRejected"
	// KindCustomerNotified is recorded when the customer was notified.
	KindCustomerNotified = "CustomerNotified"
	// KindOrderCancelled is published with each accepted cancellation.
	KindOrderCancelled = "OrderCancelled"
	// KindStockReleased is recorded when a cancellation was handled: the
	// order's reservation, if it had one, went back to stock.
	KindStockReleased = "StockReleased"
)

// Order statuses, in orders.status and order_view.status.
const (
	// StatusPlaced is an order not yet reserved or rejected.
	StatusPlaced = "placed"
	// StatusReserved is an order whose stock is reserved.
	StatusReserved = "reserved"
	// StatusRejected is an order that could not be reserved.
	StatusRejected = "rejected"
	// StatusCancelled is an order whose cancellation was handled (in
	// order_view only: orders.status keeps the reservation's outcome and
	// the cancellations table the cancellation).
	StatusCancelled = "cancelled"
)

// OrderPlaced is the event of a new order.
type OrderPlaced struct {
	// OrderID identifies the order.
	OrderID string `json:"order_id"`
	// Customer is who placed it.
	Customer string `json:"customer"`
	// SKU is the product ordered.
	SKU string `json:"sku"`
	// Qty is how many.
	Qty int `json:"qty"`
	// PlacedAt is when the order was placed.
	PlacedAt time.Time `json:"placed_at"`
}

// OrderReserved is the event of stock reserved for an order.
type OrderReserved struct {
	// OrderID identifies the order.
	OrderID string `json:"order_id"`
	// SKU is the product reserved.
	SKU string `json:"sku"`
	// Qty is how many were reserved.
	Qty int `json:"qty"`
}

// OrderRejected is the event of an order that could not be reserved.
type OrderRejected struct {
	// OrderID identifies the order.
	OrderID string `json:"order_id"`
	// Reason says why.
	Reason string `json:"reason"`
}

// CustomerNotified is the event of a notification sent for an order.
type CustomerNotified struct {
	// OrderID identifies the order.
	OrderID string `json:"order_id"`
}

// OrderCancelled is the event of a cancelled order.
type OrderCancelled struct {
	// OrderID identifies the order.
	OrderID string `json:"order_id"`
	// CancelledAt is when the cancellation was accepted.
	CancelledAt time.Time `json:"cancelled_at"`
}

// StockReleased is the event of a handled cancellation: Qty units of SKU
// went back to stock, 0 when the order held none (it had been rejected).
type StockReleased struct {
	// OrderID identifies the order.
	OrderID string `json:"order_id"`
	// SKU is the product released.
	SKU string `json:"sku"`
	// Qty is how many went back to stock.
	Qty int `json:"qty"`
}
