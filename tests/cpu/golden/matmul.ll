; ModuleID = "mm"
target triple = "unknown-unknown-unknown"
target datalayout = ""

define void @"mm"(ptr %".1", ptr %".2", ptr %".3", ptr %".4", i32 %".5")
{
entry:
  %".7" = alloca <8 x float>
  %".8" = alloca <8 x float>
  %".9" = alloca <8 x float>
  %".10" = alloca <8 x float>
  %".11" = alloca [4 x ptr]
  %".12" = getelementptr inbounds [4 x ptr], ptr %".11", i32 0, i32 0
  store ptr %".1", ptr %".12"
  %".14" = getelementptr inbounds [4 x ptr], ptr %".11", i32 0, i32 1
  store ptr %".2", ptr %".14"
  %".16" = getelementptr inbounds [4 x ptr], ptr %".11", i32 0, i32 2
  store ptr %".3", ptr %".16"
  %".18" = getelementptr inbounds [4 x ptr], ptr %".11", i32 0, i32 3
  store ptr %".4", ptr %".18"
  call void @"GOMP_parallel"(void (ptr)* @"mm_par0", ptr %".11", i32 %".5", i32 0)
  ret void
}

define internal void @"mm_par0"(ptr %".1")
{
entry:
  %".3" = alloca <8 x float>
  %".4" = alloca <8 x float>
  %".5" = alloca <8 x float>
  %".6" = alloca <8 x float>
  %".7" = getelementptr inbounds [4 x ptr], ptr %".1", i32 0, i32 0
  %".8" = load ptr, ptr %".7"
  %".9" = getelementptr inbounds [4 x ptr], ptr %".1", i32 0, i32 1
  %".10" = load ptr, ptr %".9"
  %".11" = getelementptr inbounds [4 x ptr], ptr %".1", i32 0, i32 2
  %".12" = load ptr, ptr %".11"
  %".13" = getelementptr inbounds [4 x ptr], ptr %".1", i32 0, i32 3
  %".14" = load ptr, ptr %".13"
  %".15" = call i32 @"omp_get_thread_num"()
  %".16" = sext i32 %".15" to i64
  %".17" = call i32 @"omp_get_num_threads"()
  %".18" = sext i32 %".17" to i64
  %".19" = mul i64 %".16", 2
  %".20" = sdiv i64 %".19", %".18"
  %".21" = add i64 %".16", 1
  %".22" = mul i64 %".21", 2
  %".23" = sdiv i64 %".22", %".18"
  %".24" = icmp slt i64 %".20", %".23"
  br i1 %".24", label %"p.body", label %"p.done"
p.body:
  %"p" = phi  i64 [%".20", %"entry"], [%".104", %"kk.done"]
  %".26" = urem i64 %"p", 2
  %".27" = udiv i64 %"p", 2
  store <8 x float> <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>, ptr %".3"
  store <8 x float> <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>, ptr %".4"
  store <8 x float> <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>, ptr %".5"
  store <8 x float> <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>, ptr %".6"
  %".32" = icmp slt i64 0, 6
  br i1 %".32", label %"kk.body", label %"kk.done"
p.done:
  ret void
kk.body:
  %"kk" = phi  i64 [0, %"p.body"], [%".63", %"kk.body"]
  %".34" = mul nsw i64 %".26", 12
  %".35" = add nsw i64 %".34", %"kk"
  %".36" = mul nsw i64 %"kk", 16
  %".37" = getelementptr inbounds float, ptr %".10", i64 %".36"
  %".38" = load <8 x float>, ptr %".37", align 4
  %".39" = add nsw i64 %".36", 8
  %".40" = getelementptr inbounds float, ptr %".10", i64 %".39"
  %".41" = load <8 x float>, ptr %".40", align 4
  %".42" = getelementptr inbounds float, ptr %".8", i64 %".35"
  %".43" = load float, ptr %".42", align 4
  %".44" = insertelement <8 x float> <float undef, float undef, float undef, float undef, float undef, float undef, float undef, float undef>, float %".43", i32 0
  %".45" = shufflevector <8 x float> %".44", <8 x float> <float undef, float undef, float undef, float undef, float undef, float undef, float undef, float undef>, <8 x i32> <i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0>
  %".46" = load <8 x float>, ptr %".3"
  %".47" = call <8 x float> @"llvm.fma.v8f32"(<8 x float> %".45", <8 x float> %".38", <8 x float> %".46")
  store <8 x float> %".47", ptr %".3"
  %".49" = load <8 x float>, ptr %".4"
  %".50" = call <8 x float> @"llvm.fma.v8f32"(<8 x float> %".45", <8 x float> %".41", <8 x float> %".49")
  store <8 x float> %".50", ptr %".4"
  %".52" = add nsw i64 %".35", 6
  %".53" = getelementptr inbounds float, ptr %".8", i64 %".52"
  %".54" = load float, ptr %".53", align 4
  %".55" = insertelement <8 x float> <float undef, float undef, float undef, float undef, float undef, float undef, float undef, float undef>, float %".54", i32 0
  %".56" = shufflevector <8 x float> %".55", <8 x float> <float undef, float undef, float undef, float undef, float undef, float undef, float undef, float undef>, <8 x i32> <i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0, i32 0>
  %".57" = load <8 x float>, ptr %".5"
  %".58" = call <8 x float> @"llvm.fma.v8f32"(<8 x float> %".56", <8 x float> %".38", <8 x float> %".57")
  store <8 x float> %".58", ptr %".5"
  %".60" = load <8 x float>, ptr %".6"
  %".61" = call <8 x float> @"llvm.fma.v8f32"(<8 x float> %".56", <8 x float> %".41", <8 x float> %".60")
  store <8 x float> %".61", ptr %".6"
  %".63" = add nsw nuw i64 %"kk", 1
  %".64" = icmp slt i64 %".63", 6
  br i1 %".64", label %"kk.body", label %"kk.done"
kk.done:
  %".66" = mul nsw i64 %".26", 32
  %".67" = load <8 x float>, ptr %".3"
  %".68" = getelementptr inbounds float, ptr %".12", i64 0
  %".69" = load <8 x float>, ptr %".68", align 4
  %".70" = fadd <8 x float> %".67", %".69"
  %".71" = fcmp olt <8 x float> %".70", <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>
  %".72" = select  <8 x i1> %".71", <8 x float> <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>, <8 x float> %".70"
  %".73" = getelementptr inbounds float, ptr %".14", i64 %".66"
  store <8 x float> %".72", ptr %".73", align 4
  %".75" = load <8 x float>, ptr %".4"
  %".76" = add nsw i64 0, 8
  %".77" = getelementptr inbounds float, ptr %".12", i64 %".76"
  %".78" = load <8 x float>, ptr %".77", align 4
  %".79" = fadd <8 x float> %".75", %".78"
  %".80" = fcmp olt <8 x float> %".79", <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>
  %".81" = select  <8 x i1> %".80", <8 x float> <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>, <8 x float> %".79"
  %".82" = add nsw i64 %".66", 8
  %".83" = getelementptr inbounds float, ptr %".14", i64 %".82"
  store <8 x float> %".81", ptr %".83", align 4
  %".85" = load <8 x float>, ptr %".5"
  %".86" = getelementptr inbounds float, ptr %".12", i64 0
  %".87" = load <8 x float>, ptr %".86", align 4
  %".88" = fadd <8 x float> %".85", %".87"
  %".89" = fcmp olt <8 x float> %".88", <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>
  %".90" = select  <8 x i1> %".89", <8 x float> <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>, <8 x float> %".88"
  %".91" = add nsw i64 %".66", 16
  %".92" = getelementptr inbounds float, ptr %".14", i64 %".91"
  store <8 x float> %".90", ptr %".92", align 4
  %".94" = load <8 x float>, ptr %".6"
  %".95" = add nsw i64 0, 8
  %".96" = getelementptr inbounds float, ptr %".12", i64 %".95"
  %".97" = load <8 x float>, ptr %".96", align 4
  %".98" = fadd <8 x float> %".94", %".97"
  %".99" = fcmp olt <8 x float> %".98", <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>
  %".100" = select  <8 x i1> %".99", <8 x float> <float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0, float              0x0>, <8 x float> %".98"
  %".101" = add nsw i64 %".66", 24
  %".102" = getelementptr inbounds float, ptr %".14", i64 %".101"
  store <8 x float> %".100", ptr %".102", align 4
  %".104" = add nsw nuw i64 %"p", 1
  %".105" = icmp slt i64 %".104", %".23"
  br i1 %".105", label %"p.body", label %"p.done"
}

declare void @"GOMP_parallel"(ptr %".1", ptr %".2", i32 %".3", i32 %".4")

declare i32 @"omp_get_thread_num"()

declare i32 @"omp_get_num_threads"()

declare <8 x float> @"llvm.fma.v8f32"(<8 x float> %".1", <8 x float> %".2", <8 x float> %".3")
