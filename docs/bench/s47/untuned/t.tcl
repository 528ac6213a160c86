set d [dict create]
for {set i 0} {$i < 200000} {incr i} { dict lappend d [expr {$i % 5000}] [string repeat x [expr {$i % 37}]] }
set n 0
dict for {k v} $d { incr n [llength $v] }
puts "$n [dict size $d]"
