module cgo2
go 1.19
