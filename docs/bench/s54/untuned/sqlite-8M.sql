create table t(a integer primary key, b text);
with recursive c(x) as (select 1 union all select x+1 from c where x<200000) insert into t select x, printf('%x-%x-%x', (x*2654435761) % 4294967296, (x*40503) % 65521, x*x) || hex(zeroblob(30)) from c;
create index tb on t(b);
select count(*), sum(length(b)), max(a) from t where b like '%7%';
select count(distinct substr(b,1,3)) from t;
