set d [dict create]
for {set i 0} {$i < 200000} {incr i} { dict set d "k[expr {($i * 7919) % 1000003}]" [string repeat "v$i" 3] }
set n 0; set s 0
foreach k [lsort [dict keys $d]] { incr n; incr s [string length [dict get $d $k]]; if {$n % 5000 == 0} { puts "$k [dict get $d $k]" } }
puts "$n $s"
