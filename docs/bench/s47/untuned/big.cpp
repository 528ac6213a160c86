#include <map>
#include <string>
#include <vector>
#include <algorithm>
#include <iostream>
#include <sstream>
template<int N> struct F { static constexpr long v = F<N-1>::v * 3 % 1000003 + N; };
template<> struct F<0> { static constexpr long v = 1; };
int main(){ std::map<std::string,std::vector<long>> m; for(long i=0;i<200000;i++){ std::ostringstream k; k<<"key"<<(i*7919%50000); m[k.str()].push_back(i*F<300>::v%97);} long s=0; for(auto&[k,v]:m){ std::sort(v.begin(),v.end()); s+=v[v.size()/2]*k.size(); } std::cout<<m.size()<<" "<<s<<"\n"; }
