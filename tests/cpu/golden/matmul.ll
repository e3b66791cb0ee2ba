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
  %"p" = phi  i64 [%".20", %"entry"], [%".91", %"kk.done"]
  %".26" = urem i64 %"p", 2
  %".27" = udiv i64 %"p", 2
  store <8 x float> splat (float              0x0), ptr %".3"
  store <8 x float> splat (float              0x0), ptr %".4"
  store <8 x float> splat (float              0x0), ptr %".5"
  store <8 x float> splat (float              0x0), ptr %".6"
  br label %"kk.body"
p.done:
  ret void
kk.body:
  %"kk" = phi  i64 [0, %"p.body"], [%".60", %"kk.body"]
  %".33" = mul nsw i64 %".26", 12
  %".34" = add nsw i64 %".33", %"kk"
  %".35" = getelementptr inbounds float, ptr %".8", i64 %".34"
  %".36" = mul nsw i64 %"kk", 16
  %".37" = getelementptr inbounds float, ptr %".10", i64 %".36"
  %".38" = load <8 x float>, ptr %".37", align 4
  %".39" = getelementptr inbounds float, ptr %".37", i64 8
  %".40" = load <8 x float>, ptr %".39", align 4
  %".41" = load float, ptr %".35", align 4
  %".42" = insertelement <8 x float> poison, float %".41", i32 0
  %".43" = shufflevector <8 x float> %".42", <8 x float> poison, <8 x i32> zeroinitializer
  %".44" = load <8 x float>, ptr %".3"
  %".45" = call <8 x float> @"llvm.fma.v8f32"(<8 x float> %".43", <8 x float> %".38", <8 x float> %".44")
  store <8 x float> %".45", ptr %".3"
  %".47" = load <8 x float>, ptr %".4"
  %".48" = call <8 x float> @"llvm.fma.v8f32"(<8 x float> %".43", <8 x float> %".40", <8 x float> %".47")
  store <8 x float> %".48", ptr %".4"
  %".50" = getelementptr inbounds float, ptr %".35", i64 6
  %".51" = load float, ptr %".50", align 4
  %".52" = insertelement <8 x float> poison, float %".51", i32 0
  %".53" = shufflevector <8 x float> %".52", <8 x float> poison, <8 x i32> zeroinitializer
  %".54" = load <8 x float>, ptr %".5"
  %".55" = call <8 x float> @"llvm.fma.v8f32"(<8 x float> %".53", <8 x float> %".38", <8 x float> %".54")
  store <8 x float> %".55", ptr %".5"
  %".57" = load <8 x float>, ptr %".6"
  %".58" = call <8 x float> @"llvm.fma.v8f32"(<8 x float> %".53", <8 x float> %".40", <8 x float> %".57")
  store <8 x float> %".58", ptr %".6"
  %".60" = add nsw nuw i64 %"kk", 1
  %".61" = icmp slt i64 %".60", 6
  br i1 %".61", label %"kk.body", label %"kk.done"
kk.done:
  %".63" = mul nsw i64 %".26", 32
  %".64" = getelementptr inbounds float, ptr %".14", i64 %".63"
  %".65" = load <8 x float>, ptr %".3"
  %".66" = load <8 x float>, ptr %".12", align 4
  %".67" = fadd <8 x float> %".65", %".66"
  %".68" = fcmp olt <8 x float> %".67", splat (float              0x0)
  %".69" = select  <8 x i1> %".68", <8 x float> splat (float              0x0), <8 x float> %".67"
  store <8 x float> %".69", ptr %".64", align 4
  %".71" = load <8 x float>, ptr %".4"
  %".72" = getelementptr inbounds float, ptr %".12", i64 8
  %".73" = load <8 x float>, ptr %".72", align 4
  %".74" = fadd <8 x float> %".71", %".73"
  %".75" = fcmp olt <8 x float> %".74", splat (float              0x0)
  %".76" = select  <8 x i1> %".75", <8 x float> splat (float              0x0), <8 x float> %".74"
  %".77" = getelementptr inbounds float, ptr %".64", i64 8
  store <8 x float> %".76", ptr %".77", align 4
  %".79" = load <8 x float>, ptr %".5"
  %".80" = fadd <8 x float> %".79", %".66"
  %".81" = fcmp olt <8 x float> %".80", splat (float              0x0)
  %".82" = select  <8 x i1> %".81", <8 x float> splat (float              0x0), <8 x float> %".80"
  %".83" = getelementptr inbounds float, ptr %".64", i64 16
  store <8 x float> %".82", ptr %".83", align 4
  %".85" = load <8 x float>, ptr %".6"
  %".86" = fadd <8 x float> %".85", %".73"
  %".87" = fcmp olt <8 x float> %".86", splat (float              0x0)
  %".88" = select  <8 x i1> %".87", <8 x float> splat (float              0x0), <8 x float> %".86"
  %".89" = getelementptr inbounds float, ptr %".64", i64 24
  store <8 x float> %".88", ptr %".89", align 4
  %".91" = add nsw nuw i64 %"p", 1
  %".92" = icmp slt i64 %".91", %".23"
  br i1 %".92", label %"p.body", label %"p.done"
}

declare void @"GOMP_parallel"(ptr %".1", ptr %".2", i32 %".3", i32 %".4")

declare i32 @"omp_get_thread_num"()

declare i32 @"omp_get_num_threads"()

declare <8 x float> @"llvm.fma.v8f32"(<8 x float> %".1", <8 x float> %".2", <8 x float> %".3")
